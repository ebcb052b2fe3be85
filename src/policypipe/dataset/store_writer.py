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
from policypipe.dataset.convert_cache import camera_prefix, conversion_params, load_arrays
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
    if episodes[0].get("representation") == layout.JOINT_REPRESENTATION:
        write_joint_store(tmp, episodes, cache_dir, config, frequency)
        return
    total = sum(ep["frames"] for ep in episodes)
    w, h = config.image_size

    root = zarr.open_group(tmp, mode="w", zarr_format=3)
    frames = _frame_writers(root, tmp, config, total)

    def rows(key: str, count: int, dims: tuple[int, ...], dtype: str = "float64") -> tuple[str, zarr.Array]:
        return key, root.create_array(
            key, shape=(count, *dims), dtype=dtype, chunks=(layout.LOWDIM_CHUNK, *dims)
        )

    columns = dict(
        [
            rows(layout.TIMESTAMP, total, ()),
            *(rows(layout.camera_offset(k), total, ()) for k in config.cameras[1:]),
            *(rows(layout.camera_valid(k), total, (), "bool") for k in config.cameras[1:]),
        ]
    )
    samples = {}
    for i in config.grippers:
        pose_rows = sum(ep[_samples_key(i, "pose")] for ep in episodes)
        width_rows = sum(ep[_samples_key(i, "width")] for ep in episodes)
        samples[i] = (pose_rows, width_rows)
        columns |= dict(
            [
                rows(layout.eef_pos(i), total, (3,), "float32"),
                rows(layout.eef_rot(i), total, (3,), "float32"),
                rows(layout.gripper_width(i), total, (1,), "float32"),
                rows(layout.pose_timestamp(i), pose_rows, ()),
                rows(layout.pose_pos(i), pose_rows, (3,)),
                rows(layout.pose_rot(i), pose_rows, (3,)),
                rows(layout.width_timestamp(i), width_rows, ()),
                rows(layout.width(i), width_rows, (1,)),
            ]
        )
    appenders = {k: _Appender(a, layout.LOWDIM_CHUNK) for k, a in columns.items()}
    ends: dict[str, list[int]] = {layout.EPISODE_ENDS: [0]}
    for i in config.grippers:
        ends[layout.pose_episode_ends(i)] = [0]
        ends[layout.width_episode_ends(i)] = [0]
    for ep in episodes:
        cached = load_arrays(cache_dir, ep["key"])
        _append_frames(frames, cached)
        ns = cached["capture_ns"]

        def seconds(t_ns: np.ndarray, first: int = int(ns[0])) -> np.ndarray:
            # Every time of an episode, frames and samples alike, on one clock: s since its first kept frame.
            return (t_ns - first).astype(np.float64) / 1e9

        appenders[layout.TIMESTAMP].append(seconds(ns))
        for k in config.cameras[1:]:
            appenders[layout.camera_offset(k)].append(
                cached[f"{camera_prefix(k)}offset_ns"].astype(np.float64) / 1e9
            )
            appenders[layout.camera_valid(k)].append(cached[f"{camera_prefix(k)}valid"])
        for i in config.grippers:
            prefix = "" if i == 0 else f"robot{i}_"
            appenders[layout.eef_pos(i)].append(cached[f"{prefix}eef_pos"])
            appenders[layout.eef_rot(i)].append(cached[f"{prefix}eef_rot"])
            appenders[layout.gripper_width(i)].append(cached[f"{prefix}width"])
            appenders[layout.pose_timestamp(i)].append(seconds(cached[f"{prefix}pose_ns"]))
            appenders[layout.pose_pos(i)].append(cached[f"{prefix}pose_position"])
            appenders[layout.pose_rot(i)].append(cached[f"{prefix}pose_rot"])
            appenders[layout.width_timestamp(i)].append(seconds(cached[f"{prefix}width_ns"]))
            appenders[layout.width(i)].append(cached[f"{prefix}width_values"][:, None])
            for key, count in (
                (layout.pose_episode_ends(i), len(cached[f"{prefix}pose_ns"])),
                (layout.width_episode_ends(i), len(cached[f"{prefix}width_ns"])),
            ):
                ends[key].append(ends[key][-1] + count)
        ends[layout.EPISODE_ENDS].append(ends[layout.EPISODE_ENDS][-1] + len(ns))
    for writer in frames.values():
        writer.close()
    for appender in appenders.values():
        appender.close()
    for key, episode_ends in ends.items():
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
            layout.ATTRS_GRIPPERS: list(config.grippers),
            layout.ATTRS_CAMERAS: list(config.cameras),
        }
    )


def write_joint_store(
    tmp: Path, episodes: list[dict[str, Any]], cache_dir: Path, config: ConvertConfig, frequency: float
) -> None:
    """A joint-space dataset (`dataset.joint`): the rows' joint vectors, commands and frames."""
    total = sum(ep["frames"] for ep in episodes)
    w, h = config.image_size
    root = zarr.open_group(tmp, mode="w", zarr_format=3)
    frames = _frame_writers(root, tmp, config, total)
    dims = len(episodes[0]["joint_names"])

    def rows(key: str, shape: tuple[int, ...], dtype: str) -> _Appender:
        array = root.create_array(
            key, shape=(total, *shape), dtype=dtype, chunks=(layout.LOWDIM_CHUNK, *shape)
        )
        return _Appender(array, layout.LOWDIM_CHUNK)

    columns = {
        layout.TIMESTAMP: rows(layout.TIMESTAMP, (), "float64"),
        layout.JOINT_STATE: rows(layout.JOINT_STATE, (dims,), "float32"),
        layout.JOINT_ACTION: rows(layout.JOINT_ACTION, (dims,), "float32"),
        **{layout.camera_offset(k): rows(layout.camera_offset(k), (), "float64") for k in config.cameras[1:]},
        **{layout.camera_valid(k): rows(layout.camera_valid(k), (), "bool") for k in config.cameras[1:]},
    }
    ends = [0]
    for ep in episodes:
        cached = load_arrays(cache_dir, ep["key"])
        _append_frames(frames, cached)
        ns = cached["capture_ns"]
        columns[layout.TIMESTAMP].append((ns - ns[0]).astype(np.float64) / 1e9)
        columns[layout.JOINT_STATE].append(cached["joint_state"])
        columns[layout.JOINT_ACTION].append(cached["joint_action"])
        for k in config.cameras[1:]:
            columns[layout.camera_offset(k)].append(
                cached[f"{camera_prefix(k)}offset_ns"].astype(np.float64) / 1e9
            )
            columns[layout.camera_valid(k)].append(cached[f"{camera_prefix(k)}valid"])
        ends.append(ends[-1] + len(ns))
    for writer in frames.values():
        writer.close()
    for appender in columns.values():
        appender.close()
    root.create_array(
        layout.EPISODE_ENDS, data=np.asarray(ends[1:], dtype=np.int64), chunks=(max(len(episodes), 1),)
    )
    names = episodes[0]["joint_names"]
    root.attrs.update(
        {
            layout.ATTRS_FORMAT: layout.FORMAT_VERSION,
            layout.ATTRS_FREQUENCY: frequency,
            layout.ATTRS_IMAGE_SIZE: [w, h],
            layout.ATTRS_PARAMS: conversion_params(config),
            layout.ATTRS_EPISODES: [{k: v for k, v in ep.items() if k != "key"} for ep in episodes],
            layout.ATTRS_GRIPPERS: [],
            layout.ATTRS_CAMERAS: list(config.cameras),
            layout.ATTRS_REPRESENTATION: layout.JOINT_REPRESENTATION,
            layout.ATTRS_JOINT_NAMES: names,
            layout.ATTRS_GRIPPER_JOINTS: layout.gripper_joints(names),
        }
    )


def _frame_writers(
    root: zarr.Group, tmp: Path, config: ConvertConfig, total: int
) -> dict[int, FrameShardWriter]:
    """Every kept camera's frame array of `total` rows, written shard by shard."""
    return {
        k: FrameShardWriter(
            tmp,
            create_frames_array(
                root,
                layout.camera_rgb(k),
                total,
                config.image_size,
                layout.FRAMES_PER_SHARD,
                config.jpeg_quality,
            ),
        )
        for k in config.cameras
    }


def _append_frames(frames: dict[int, FrameShardWriter], cached: dict[str, np.ndarray]) -> None:
    """One cache entry's JPEG frames, camera by camera, as they were encoded."""
    for k, writer in frames.items():
        prefix = camera_prefix(k)
        data, offsets = cached[f"{prefix}jpeg"].tobytes(), cached[f"{prefix}jpeg_offsets"]
        writer.append([data[a:b] for a, b in zip(offsets[:-1], offsets[1:])])


def _samples_key(i: int, kind: str) -> str:
    """The cache record's count of gripper i's pose or width samples."""
    return f"{kind}_samples" if i == 0 else f"robot{i}_{kind}_samples"


def replace_dir(tmp: Path, out_path: Path) -> None:
    old = out_path.with_name(f".{out_path.name}.old-{os.getpid()}")
    if out_path.exists():
        os.replace(out_path, old)
    os.replace(tmp, out_path)
    shutil.rmtree(old, ignore_errors=True)
