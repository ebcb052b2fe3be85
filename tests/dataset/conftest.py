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


def make_store(path: Path, lengths=(30, 25, 40, 35, 28, 33), size=(16, 12), seed=0) -> zarr.Group:
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    t = np.arange(total) / 30.0
    phase = rng.uniform(0, 6, 6)
    pos = np.stack([0.1 * np.sin(t + phase[0]), 0.1 * np.cos(0.7 * t + phase[1]), 0.2 + 0.05 * np.sin(1.3 * t)], axis=1)
    rotvec = Rotation.from_euler("xyz", np.stack([0.3 * np.sin(t + phase[3]), 0.2 * np.cos(t), t * 0.4 + phase[5]], axis=1)).as_rotvec()
    width = 0.05 + 0.03 * np.sin(2 * t + phase[2])
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    stamps = np.concatenate([np.arange(n) / 30.0 for n in lengths])
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    frames = [np.stack([(x * 9 + i) % 256, (y * 13 + 2 * i) % 256, (x + y + 3 * i) % 256], axis=-1).astype(np.uint8) for i in range(total)]

    root = zarr.open_group(path, mode="w", zarr_format=3)
    rgb = create_frames_array(root, layout.RGB, total, size, 10, 95)
    writer = FrameShardWriter(path, rgb)
    writer.append([encode_jpeg(f, 95) for f in frames])
    writer.close()
    root.create_array(layout.EEF_POS, data=pos.astype(np.float32), chunks=(64, 3))
    root.create_array(layout.EEF_ROT, data=rotvec.astype(np.float32), chunks=(64, 3))
    root.create_array(layout.GRIPPER_WIDTH, data=width.astype(np.float32)[:, None], chunks=(64, 1))
    root.create_array(layout.TIMESTAMP, data=stamps, chunks=(64,))
    root.create_array(layout.EPISODE_ENDS, data=ends.astype(np.int64), chunks=(len(ends),))
    root.attrs.update(
        {
            layout.ATTRS_FORMAT: layout.FORMAT_VERSION,
            layout.ATTRS_FREQUENCY: 30.0,
            layout.ATTRS_IMAGE_SIZE: list(size),
            layout.ATTRS_EPISODES: [{"stem": f"ep{i}", "frames": int(n), "start": int(s)} for i, (n, s) in enumerate(zip(lengths, starts))],
        }
    )
    return root


@pytest.fixture
def store(tmp_path: Path) -> Path:
    make_store(tmp_path / "ds.zarr")
    return tmp_path / "ds.zarr"
