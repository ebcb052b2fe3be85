"""A tiny dataset store in the real layout, with smooth known trajectories."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.frame_shards import FrameShardWriter, create_frames_array
from policypipe.dataset.image_codec import encode_jpeg

POSE_HZ, WIDTH_HZ = 150.0, 45.0


def trajectory(t: np.ndarray, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Smooth known motion at times `t` (s): positions (N, 3), rotation vectors (N, 3), widths (N,)."""
    pos = np.stack(
        [0.1 * np.sin(t + phase[0]), 0.1 * np.cos(0.7 * t + phase[1]), 0.2 + 0.05 * np.sin(1.3 * t)], axis=1
    )
    rotvec = Rotation.from_euler(
        "xyz", np.stack([0.3 * np.sin(t + phase[3]), 0.2 * np.cos(t), t * 0.4 + phase[5]], axis=1)
    ).as_rotvec()
    return pos, rotvec, 0.05 + 0.03 * np.sin(2 * t + phase[2])


def make_store(
    path: Path, lengths=(30, 25, 40, 35, 28, 33), size=(16, 12), seed=0, drop_fraction=0.0
) -> zarr.Group:
    """Episodes of `lengths` frames at 30 Hz (a `drop_fraction` of the camera's frames missing),
    with pose samples at 150 Hz and width samples at 45 Hz covering them, as convert writes them.
    Episode e's motion is `trajectory(offset_e + t, phase)` at time t of its clock."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 6, 6)
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    stamps, pose_t, width_t, offsets = [], [], [], []
    for n in lengths:
        slots = np.concatenate(
            [[0], np.cumsum(1 + (rng.random(n - 1) < drop_fraction) * rng.integers(1, 3, n - 1))]
        )
        stamps.append(slots / 30.0)
        # The samples just outside the frames' span too, each stream on its own phase.
        pose_t.append(
            (np.arange(-1, int(np.ceil(stamps[-1][-1] * POSE_HZ)) + 1) + rng.uniform(0.1, 0.9)) / POSE_HZ
        )
        width_t.append(
            (np.arange(-1, int(np.ceil(stamps[-1][-1] * WIDTH_HZ)) + 1) + rng.uniform(0.1, 0.9)) / WIDTH_HZ
        )
        offsets.append(sum(s[-1] + 1.0 for s in stamps[:-1]))
    frame_pos, frame_rot, frame_width = trajectory(
        np.concatenate([o + s for o, s in zip(offsets, stamps)]), phase
    )
    pose_pos, pose_rot, _ = trajectory(np.concatenate([o + t for o, t in zip(offsets, pose_t)]), phase)
    width = trajectory(np.concatenate([o + t for o, t in zip(offsets, width_t)]), phase)[2]
    total = int(ends[-1])
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    frames = [
        np.stack([(x * 9 + i) % 256, (y * 13 + 2 * i) % 256, (x + y + 3 * i) % 256], axis=-1).astype(np.uint8)
        for i in range(total)
    ]

    root = zarr.open_group(path, mode="w", zarr_format=3)
    rgb = create_frames_array(root, layout.RGB, total, size, 10, 95)
    writer = FrameShardWriter(path, rgb)
    writer.append([encode_jpeg(f, 95) for f in frames])
    writer.close()
    root.create_array(layout.EEF_POS, data=frame_pos.astype(np.float32), chunks=(64, 3))
    root.create_array(layout.EEF_ROT, data=frame_rot.astype(np.float32), chunks=(64, 3))
    root.create_array(layout.GRIPPER_WIDTH, data=frame_width.astype(np.float32)[:, None], chunks=(64, 1))
    root.create_array(layout.TIMESTAMP, data=np.concatenate(stamps), chunks=(64,))
    root.create_array(layout.EPISODE_ENDS, data=ends.astype(np.int64), chunks=(len(ends),))
    root.create_array(layout.POSE_TIMESTAMP, data=np.concatenate(pose_t), chunks=(256,))
    root.create_array(layout.POSE_POS, data=pose_pos, chunks=(256, 3))
    root.create_array(layout.POSE_ROT, data=pose_rot, chunks=(256, 3))
    root.create_array(layout.WIDTH_TIMESTAMP, data=np.concatenate(width_t), chunks=(256,))
    root.create_array(layout.WIDTH, data=width[:, None], chunks=(256, 1))
    root.create_array(layout.POSE_EPISODE_ENDS, data=np.cumsum([len(t) for t in pose_t]), chunks=(len(ends),))
    root.create_array(
        layout.WIDTH_EPISODE_ENDS, data=np.cumsum([len(t) for t in width_t]), chunks=(len(ends),)
    )
    root.attrs.update(
        {
            layout.ATTRS_FORMAT: layout.FORMAT_VERSION,
            layout.ATTRS_GRIPPERS: [0],
            layout.ATTRS_CAMERAS: [0],
            layout.ATTRS_FREQUENCY: 30.0,
            layout.ATTRS_IMAGE_SIZE: list(size),
            layout.ATTRS_EPISODES: [
                {"stem": f"ep{i}", "frames": int(n), "start": int(s)}
                for i, (n, s) in enumerate(zip(lengths, starts))
            ],
        }
    )
    return root


@pytest.fixture
def store(tmp_path: Path) -> Path:
    make_store(tmp_path / "ds.zarr")
    return tmp_path / "ds.zarr"
