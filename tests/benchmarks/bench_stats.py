"""Statistics benchmark (`make bench`): 1,000,000 low-dimensional frames plus a sharded JPEG
image array, against a one-shot NumPy computation over the same arrays loaded in memory."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.frame_shards import FrameShardWriter, create_frames_array
from policypipe.dataset.image_codec import encode_jpeg
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import EpisodeStreams, WindowConfig


def generate_store(path: Path, frames: int, episode_len: int, image_size=(48, 48)) -> zarr.Group:
    rng = np.random.default_rng(0)
    t = np.arange(frames) / 30.0
    pos = np.cumsum(rng.normal(0, 0.002, (frames, 3)), axis=0).astype(np.float32)
    rotvec = (
        Rotation.from_euler("xyz", np.stack([0.2 * np.sin(t), 0.1 * np.cos(t), 0.01 * t], 1))
        .as_rotvec()
        .astype(np.float32)
    )
    width = (0.05 + 0.03 * np.sin(t)).astype(np.float32)[:, None]
    ends = np.arange(episode_len, frames + 1, episode_len, dtype=np.int64)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    for key, data in ((layout.EEF_POS, pos), (layout.EEF_ROT, rotvec), (layout.GRIPPER_WIDTH, width)):
        root.create_array(key, data=data, chunks=(layout.LOWDIM_CHUNK, data.shape[1]))
    stamps = np.tile(np.arange(episode_len) / 30.0, len(ends))
    root.create_array(layout.TIMESTAMP, data=stamps, chunks=(layout.LOWDIM_CHUNK,))
    root.create_array(layout.EPISODE_ENDS, data=ends, chunks=(len(ends),))
    # The recorded streams: here the frames' own values at their times (timing, not rate, is measured).
    for key, data in (
        (layout.POSE_TIMESTAMP, stamps),
        (layout.WIDTH_TIMESTAMP, stamps),
        (layout.POSE_POS, pos),
        (layout.POSE_ROT, rotvec),
        (layout.WIDTH, width),
    ):
        root.create_array(key, data=data.astype(np.float64), chunks=(layout.LOWDIM_CHUNK, *data.shape[1:]))
    for key in (layout.POSE_EPISODE_ENDS, layout.WIDTH_EPISODE_ENDS):
        root.create_array(key, data=ends, chunks=(len(ends),))
    # The image array as convert writes it (JPEG frames in shards of 100); 100 distinct frames repeat.
    w, h = image_size
    y, x = np.mgrid[0:h, 0:w]
    shard = [
        encode_jpeg(
            np.stack([(x * 5 + i) % 256, (y * 7 + i) % 256, (x + y + i) % 256], -1).astype(np.uint8), 95
        )
        for i in range(100)
    ]
    writer = FrameShardWriter(
        path, create_frames_array(root, layout.RGB, frames, image_size, layout.FRAMES_PER_SHARD, 95)
    )
    for _ in range(frames // 100):
        writer.append(shard)
    writer.close()
    root.attrs.update(
        {
            layout.ATTRS_EPISODES: [{"stem": f"e{i}"} for i in range(len(ends))],
            layout.ATTRS_FREQUENCY: 30.0,
            layout.ATTRS_FORMAT: layout.FORMAT_VERSION,
            layout.ATTRS_GRIPPERS: [0],
            layout.ATTRS_CAMERAS: [0],
        }
    )
    return root


def numpy_one_shot(root: zarr.Group, train: list[int], window: WindowConfig) -> dict:
    """Everything in memory at once, numpy reductions over the full sample arrays."""
    streams = EpisodeStreams.from_store(root)
    w = streams.windows(streams.anchors(train, window)[0], window)
    out = {}
    for name, x in (
        ("action", w.action.reshape(-1, 10)),
        ("obs.eef_pose_rel", w.obs_pose.reshape(-1, 9)),
        ("obs.gripper_width", w.obs_width.reshape(-1, 1)),
    ):
        out[name] = (x.mean(0), x.std(0), x.min(0), x.max(0), np.quantile(x, [0.01, 0.99], axis=0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=1_000_000)
    args = parser.parse_args()
    window = WindowConfig()
    config = StatsConfig()
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        t0 = time.perf_counter()
        root = generate_store(Path(tmp) / "ds.zarr", args.frames, episode_len=500)
        print(
            f"statistics over {args.frames:,} frames ({args.frames // 500} episodes; "
            f"store written in {time.perf_counter() - t0:.1f} s)"
        )
        t0, cpu0 = time.perf_counter(), time.process_time()
        stats = compute_statistics(root, window, config)
        ours, ours_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        t0, cpu0 = time.perf_counter(), time.process_time()
        reference = numpy_one_shot(root, stats["split"]["train"], window)
        baseline, baseline_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        mean_err = max(
            np.abs(np.asarray(stats["lowdim"][k]["mean"]) - reference[k][0]).max() for k in reference
        )
        # CPU seconds beside the wall clock: on a shared machine the wall clock also counts the
        # time other jobs held the cores.
        print(
            f"  policypipe stats (chunked, 2 passes, + image sample)  {ours:6.1f} s (target < 20 s; "
            f"CPU {ours_cpu:.1f} s)"
        )
        print(
            f"  numpy one-shot, all in memory (low-dim only)          {baseline:6.1f} s "
            f"(CPU {baseline_cpu:.1f} s)"
        )
        print(f"  ratio                                                 {ours / baseline:6.2f}")
        print(f"  max |mean difference|                                 {mean_err:.1e}")


if __name__ == "__main__":
    main()
