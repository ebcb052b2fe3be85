"""The zarr store assembled from cache entries, episode by episode in manifest order, under a
temporary name, then renamed into place: byte-identical whatever the number of workers, and a
killed run leaves the previous store or none. Memory holds one episode and one shard of frames
at a time. The layout is `dataset.layout` (docs/dataset.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from policypipe.dataset import layout
from policypipe.dataset.convert_cache import conversion_params, load_arrays
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.errors import DatasetError, is_disk_full, megabytes
from policypipe.dataset.frame_shards import FrameShardWriter, create_frames_array


class _Appender:
    """Appends rows to a zarr array in whole chunks, so no chunk is written twice."""

    def __init__(self, array: zarr.Array, block: int) -> None:
        self.array, self.block, self.pending, self.written = array, block, [], 0

    def append(self, rows: np.ndarray) -> None:
        self.pending.append(rows)
        buffered = sum(len(p) for p in self.pending)
        if buffered >= self.block:
            data = np.concatenate(self.pending)
            full = len(data) // self.block * self.block
            self.array[self.written : self.written + full] = data[:full]
            self.written += full
            self.pending = [data[full:]] if full < len(data) else []

    def close(self) -> None:
        if self.pending:
            data = np.concatenate(self.pending)
            self.array[self.written : self.written + len(data)] = data
            self.written += len(data)
            self.pending = []


def assemble_store(
    out_path: Path, episodes: list[dict[str, Any]], cache_dir: Path, config: ConvertConfig, frequency: float
) -> None:
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    for stale in out_path.parent.glob(f".{out_path.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
    try:
        write_store(tmp, episodes, cache_dir, config, frequency)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            needed = sum((cache_dir / f"{ep['key']}.npz").stat().st_size for ep in episodes)
            raise DatasetError(
                f"no space left on the device writing the dataset {out_path}: "
                f"it needs about {megabytes(needed)}, and {out_path.parent} has "
                f"{megabytes(shutil.disk_usage(out_path.parent).free)} free. Free space there "
                "and run again (the conversion cache is kept; the previous dataset, if any, is untouched)."
            ) from None
        raise
    replace_dir(tmp, out_path)


def write_store(
    tmp: Path, episodes: list[dict[str, Any]], cache_dir: Path, config: ConvertConfig, frequency: float
) -> None:
    total = sum(ep["frames"] for ep in episodes)
    w, h = config.image_size

    root = zarr.open_group(tmp, mode="w", zarr_format=3)
    rgb = create_frames_array(root, layout.RGB, total, (w, h), layout.FRAMES_PER_SHARD, config.jpeg_quality)
    frames = FrameShardWriter(tmp, rgb)
    lowdim = {
        key: root.create_array(
            key,
            shape=(total, 1 if key == layout.GRIPPER_WIDTH else 3),
            dtype="float32",
            chunks=(layout.LOWDIM_CHUNK, 1 if key == layout.GRIPPER_WIDTH else 3),
        )
        for key in layout.LOWDIM_KEYS
    }
    stamps = root.create_array(
        layout.TIMESTAMP, shape=(total,), dtype="float64", chunks=(layout.LOWDIM_CHUNK,)
    )
    pose_rows = sum(ep["pose_samples"] for ep in episodes)
    width_rows = sum(ep["width_samples"] for ep in episodes)
    streams = {
        key: root.create_array(key, shape=(rows, *dims), dtype="float64", chunks=(layout.LOWDIM_CHUNK, *dims))
        for key, rows, dims in (
            (layout.POSE_TIMESTAMP, pose_rows, ()),
            (layout.POSE_POS, pose_rows, (3,)),
            (layout.POSE_ROT, pose_rows, (3,)),
            (layout.WIDTH_TIMESTAMP, width_rows, ()),
            (layout.WIDTH, width_rows, (1,)),
        )
    }
    appenders = {
        k: _Appender(a, layout.LOWDIM_CHUNK)
        for k, a in {**lowdim, layout.TIMESTAMP: stamps, **streams}.items()
    }
    ends, pose_ends, width_ends = [0], [0], [0]
    for ep in episodes:
        arrays = load_arrays(cache_dir, ep["key"])
        data, offsets = arrays["jpeg"].tobytes(), arrays["jpeg_offsets"]
        frames.append([data[a:b] for a, b in zip(offsets[:-1], offsets[1:])])
        appenders[layout.EEF_POS].append(arrays["eef_pos"])
        appenders[layout.EEF_ROT].append(arrays["eef_rot"])
        appenders[layout.GRIPPER_WIDTH].append(arrays["width"])
        ns = arrays["capture_ns"]
        # Every time of an episode, frames and samples alike, on one clock: s since its first kept frame.
        appenders[layout.TIMESTAMP].append((ns - ns[0]).astype(np.float64) / 1e9)
        appenders[layout.POSE_TIMESTAMP].append((arrays["pose_ns"] - ns[0]).astype(np.float64) / 1e9)
        appenders[layout.POSE_POS].append(arrays["pose_position"])
        appenders[layout.POSE_ROT].append(arrays["pose_rot"])
        appenders[layout.WIDTH_TIMESTAMP].append((arrays["width_ns"] - ns[0]).astype(np.float64) / 1e9)
        appenders[layout.WIDTH].append(arrays["width_values"][:, None])
        ends.append(ends[-1] + len(ns))
        pose_ends.append(pose_ends[-1] + len(arrays["pose_ns"]))
        width_ends.append(width_ends[-1] + len(arrays["width_ns"]))
    frames.close()
    for appender in appenders.values():
        appender.close()
    for key, episode_ends in (
        (layout.EPISODE_ENDS, ends),
        (layout.POSE_EPISODE_ENDS, pose_ends),
        (layout.WIDTH_EPISODE_ENDS, width_ends),
    ):
        root.create_array(
            key, data=np.asarray(episode_ends[1:], dtype=np.int64), chunks=(max(len(episodes), 1),)
        )
    root.attrs.update(
        {
            layout.ATTRS_FORMAT: layout.FORMAT_VERSION,
            layout.ATTRS_FREQUENCY: frequency,
            layout.ATTRS_IMAGE_SIZE: [w, h],
            layout.ATTRS_PARAMS: conversion_params(config),
            layout.ATTRS_EPISODES: [{k: v for k, v in ep.items() if k != "key"} for ep in episodes],
        }
    )


def replace_dir(tmp: Path, out_path: Path) -> None:
    old = out_path.with_name(f".{out_path.name}.old-{os.getpid()}")
    if out_path.exists():
        os.replace(out_path, old)
    os.replace(tmp, out_path)
    shutil.rmtree(old, ignore_errors=True)
