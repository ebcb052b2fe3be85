"""A dataset as a LeRobotDataset v3.0 folder (docs/interop.md): what `lerobot`'s
`LeRobotDataset(repo_id, root=OUT)` loads, written from the format alone (pyarrow, PyAV).

The layout is LeRobot's (`lerobot.datasets.utils`, codebase_version "v3.0"): `meta/info.json`,
`meta/tasks.parquet`, `meta/stats.json`, `meta/episodes/chunk-000/file-000.parquet`,
`data/chunk-000/file-000.parquet` (one row per frame) and per camera
`videos/<key>/chunk-000/file-000.mp4` (the episodes one after the other, H.264).

LeRobot looks a frame up at `from_timestamp + frame_index / fps` within 1e-4 s, so frames must sit
on an exact grid: the dataset must have been converted with `convert.resample_hz` (an integer
rate), or be a joint-space dataset (`dataset.joint`), whose rows are its files' control steps at an
integer `pair.aloha.control_hz`. Its rows are the frames nearest each grid time; a grid time whose
nearest frame is also a neighbour's (a dropped frame) has no row of its own, and the export
repeats the nearer row there, counting it (`policypipe.filled_slots` in `meta/info.json`, per
episode in the sidecar): the frames are never shifted, a slot is filled in the open.

State and action are absolute, as LeRobot's policies take them: per gripper the position (m,
world frame), the rotation as an axis-angle vector (rad) and the opening (m); the action at frame
t is the state at t + 1 / fps (the last frame's, its own). policypipe's own training uses the
relative representation of `dataset.windows` instead. A joint-space dataset's state is the
joint vector and its action the command recorded at the frame, as ALOHA's LeRobot datasets hold
them (`REPRESENTATION`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.h264 import x264_params
from policypipe.lineage.hashing import sha256_file

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
SIDECAR = "meta/policypipe.json"
# Off the grid by more than this (beyond half a period): the dataset's rows are not its grid's.
GRID_TOLERANCE_S = 1e-6
# What the sidecar says the vectors are, for a dataset of gripper poses and a joint-space one.
REPRESENTATION = {
    "pose": {
        "observation.state": "per gripper: position (m, world frame), rotation axis-angle (rad, "
        "world <- gripper), opening (m)",
        "action": "the state at the next frame (t + 1 / fps); the episode's last frame: its own",
        "timestamp": "frame_index / fps: the grid of convert.resample_hz",
    },
    "joint": {
        "observation.state": "the joint vector at the frame (observations/qpos), in the dataset's units",
        "action": "the command recorded at the frame (action), absolute",
        "timestamp": "frame_index / fps: the files' control steps (pair.aloha.control_hz)",
    },
}


class ExportError(ValueError):
    """A dataset the export cannot write as LeRobot reads it; the message says what to change."""


@dataclass(frozen=True)
class LeRobotExportConfig:
    task: str  # the task string of every episode (LeRobot's `task`)
    robot_type: str = "policypipe_handheld_gripper"
    crf: int = 18  # libx264's quality: 18 is visually lossless
    data_files_size_in_mb: int = 100  # what LeRobot writes in info.json (one file is written here)
    video_files_size_in_mb: int = 200


@dataclass(frozen=True)
class ExportSummary:
    out: Path
    episodes: int
    frames: int
    filled_slots: int
    bytes_written: int


def export_lerobot(store: Path, out: Path, config: LeRobotExportConfig) -> ExportSummary:
    """Writes the LeRobotDataset v3.0 folder `out` (which must not exist) from the dataset `store`;
    ExportError when the dataset cannot be written as LeRobot reads it."""
    store, out = Path(store), Path(out)
    if out.exists():
        raise ExportError(f"{out} exists: give a new folder (the export never overwrites one)")
    if not config.task.strip():
        raise ExportError("the task string is empty: give the task of the demonstrations (--task)")
    root = zarr.open_group(store, mode="r")
    if root.attrs.get(layout.ATTRS_FORMAT) != layout.FORMAT_VERSION:
        raise ExportError(
            f"dataset {store} has format {root.attrs.get(layout.ATTRS_FORMAT)}, this version exports "
            f"format {layout.FORMAT_VERSION}: rebuild it with `dvc repro convert`"
        )
    joint_space = layout.is_joint_space(root.attrs)
    fps = _grid_rate(store, root)
    grippers, cameras = list(root.attrs[layout.ATTRS_GRIPPERS]), list(root.attrs[layout.ATTRS_CAMERAS])
    ends = root[layout.EPISODE_ENDS][:].astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    stamps = root[layout.TIMESTAMP][:].astype(np.float64)
    if joint_space:
        state, commands = root[layout.JOINT_STATE][:], root[layout.JOINT_ACTION][:]
        names = list(root.attrs[layout.ATTRS_JOINT_NAMES])
    else:
        state = np.concatenate(
            [
                np.concatenate(
                    [
                        root[layout.eef_pos(i)][:].astype(np.float64),
                        root[layout.eef_rot(i)][:].astype(np.float64),
                        root[layout.gripper_width(i)][:].astype(np.float64).reshape(-1, 1),
                    ],
                    axis=1,
                )
                for i in grippers
            ],
            axis=1,
        ).astype(np.float32)
        names = state_names(grippers)
    # Per episode: the row of every grid slot.
    slot_rows, filled = [], []
    for e, (a, b) in enumerate(zip(starts, ends)):
        rows, n_filled = _slot_rows(stamps[a:b] - stamps[a], fps, store, e)
        slot_rows.append(a + rows)
        filled.append(n_filled)
    rows = np.concatenate(slot_rows)
    lengths = np.array([len(r) for r in slot_rows], np.int64)
    episode_index = np.repeat(np.arange(len(lengths)), lengths)
    frame_index = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    frame_state = state[rows]
    if joint_space:  # the command recorded at the frame
        action = commands[rows]
    else:  # the state at t + 1 / fps; the episode's last frame keeps its own
        next_slot = np.concatenate([np.minimum(np.arange(n) + 1, n - 1) for n in lengths])
        offsets = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        action = frame_state[offsets + next_slot]
    timestamp = (frame_index / fps).astype(np.float32)

    columns: dict[str, np.ndarray] = {
        "observation.state": frame_state,
        "action": action,
        "timestamp": timestamp,
        "frame_index": frame_index,
        "episode_index": episode_index,
        "index": np.arange(len(rows), dtype=np.int64),
        "task_index": np.zeros(len(rows), np.int64),
    }
    for k in cameras[1:]:  # whether the row has camera k's frame (convert.max_camera_offset_ms)
        columns[f"observation.camera{k}_valid"] = root[layout.camera_valid(k)][:][rows]
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    (partial / "meta").mkdir(parents=True)
    try:
        _write_folder(
            partial, store, root, config, fps, cameras, rows, lengths, filled, columns, names, joint_space
        )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-written is left behind
        raise
    written = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
    partial.rename(out)  # whole exports only
    return ExportSummary(out, len(lengths), int(lengths.sum()), int(sum(filled)), written)


def _write_folder(
    partial: Path,
    store: Path,
    root: zarr.Group,
    config: LeRobotExportConfig,
    fps: int,
    cameras: list[int],
    rows: np.ndarray,
    lengths: np.ndarray,
    filled: list[int],
    columns: dict[str, np.ndarray],
    names: list[str],
    joint_space: bool,
) -> None:
    _write_data(partial / DATA_PATH.format(chunk_index=0, file_index=0), columns)
    image_size = tuple(root.attrs[layout.ATTRS_IMAGE_SIZE])
    video_keys = {k: f"observation.images.camera{k}" for k in cameras}
    image_stats = {}
    for k, key in video_keys.items():
        path = partial / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        image_stats[key] = _write_video(
            path, FrameShardReader(store, layout.camera_rgb(k)), rows, fps, config.crf
        )
    features = _features(names, cameras, video_keys, image_size, fps)
    stats = {name: _vector_stats(values) for name, values in columns.items()} | image_stats
    write_json_atomic(partial / "meta/stats.json", stats)
    _write_tasks(partial / "meta/tasks.parquet", [config.task])
    _write_episodes(partial / EPISODES_PATH, lengths, fps, config.task, video_keys, columns)
    digest = fingerprint(root).digest
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": config.robot_type,
        "total_episodes": len(lengths),
        "total_frames": int(lengths.sum()),
        "total_tasks": 1,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": config.data_files_size_in_mb,
        "video_files_size_in_mb": config.video_files_size_in_mb,
        "fps": fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH,
        "features": features,
        # An extra key, which LeRobot does not read: where the export came from, and the hash of
        # the statistics a policy trained on it normalises by.
        "policypipe": {
            "dataset_fingerprint": digest,
            "stats_sha256": sha256_file(partial / "meta/stats.json"),
            "filled_slots": int(sum(filled)),
            "sidecar": SIDECAR,
        },
    }
    write_json_atomic(partial / "meta/info.json", info)
    episodes = root.attrs[layout.ATTRS_EPISODES]
    write_json_atomic(
        partial / SIDECAR,
        {
            "dataset": {"path": store.as_posix(), "fingerprint": digest},
            "representation": REPRESENTATION["joint" if joint_space else "pose"],
            "episodes": [
                {
                    "episode_index": e,
                    "stem": ep["stem"],
                    "vio_sha256": ep["vio_sha256"],
                    "frames": int(lengths[e]),
                    "filled_slots": filled[e],
                }
                # An imported demo: vio_sha256 is its HDF5 file's, and this its key inside it.
                | ({"source": ep["source"]} if "source" in ep else {})
                for e, ep in enumerate(episodes)
            ],
        },
    )


def state_names(grippers: list[int]) -> list[str]:
    parts = ("x", "y", "z", "rx", "ry", "rz", "width")
    return [f"robot{i}_{p}" for i in grippers for p in parts]


def _grid_rate(store: Path, root: zarr.Group) -> int:
    if layout.is_joint_space(root.attrs):  # the rows are the files' control steps
        rate = float(root.attrs[layout.ATTRS_FREQUENCY])
        if rate != int(rate):
            raise ExportError(
                f"dataset {store} is at pair.aloha.control_hz = {rate} Hz: LeRobot's fps is an integer"
            )
        return int(rate)
    rate = root.attrs[layout.ATTRS_PARAMS].get("resample_hz")
    if rate is None:
        raise ExportError(
            f"dataset {store} is on camera 0's own clock (convert.resample_hz: null): LeRobot looks a "
            "frame up at frame_index / fps within 0.1 ms, so the frames must sit on a grid. Convert with "
            "convert.resample_hz set to an integer rate (e.g. 30) and export that dataset"
        )
    if float(rate) != int(rate):
        raise ExportError(
            f"dataset {store} was resampled at convert.resample_hz = {rate}: LeRobot's fps is an integer; "
            "convert with an integer convert.resample_hz"
        )
    return int(rate)


def _slot_rows(t_s: np.ndarray, fps: int, store: Path, episode: int) -> tuple[np.ndarray, int]:
    """(the row of each grid slot 0..J of one episode, how many slots repeat a neighbour's row).
    `t_s`: the rows' capture times from the episode's first."""
    slot = np.rint(t_s * fps).astype(np.int64)
    off = np.abs(t_s - slot / fps)
    if (off > 0.5 / fps + GRID_TOLERANCE_S).any() or (np.diff(slot) <= 0).any() or slot[0] != 0:
        raise ExportError(
            f"episode {episode} of {store}: its rows are not on the {fps} Hz grid of "
            "convert.resample_hz (a row more than half a period from its grid time, or two rows in one "
            "slot): rebuild the dataset with `dvc repro convert`"
        )
    slots = np.arange(slot[-1] + 1)
    # The row nearest each slot in time (ties to the earlier): the row itself where it has one.
    right = np.clip(np.searchsorted(slot, slots), 0, len(slot) - 1)
    left = np.clip(right - 1, 0, len(slot) - 1)
    rows = np.where(np.abs(slot[left] - slots) <= np.abs(slot[right] - slots), left, right)
    rows = np.where(slot[right] == slots, right, rows)
    return rows, int(len(slots) - len(slot))


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise ExportError(f"the LeRobot export needs pyarrow ({exc}): run `make setup`") from None
    return pa, pq


def _arrow_column(values: np.ndarray):
    pa, _ = _pyarrow()
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def _write_parquet(path: Path, columns: dict[str, Any], metadata: dict[bytes, bytes] | None = None) -> None:
    pa, pq = _pyarrow()
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path, compression="snappy")


def _write_data(path: Path, columns: dict[str, np.ndarray]) -> None:
    _write_parquet(path, {name: _arrow_column(values) for name, values in columns.items()})


def _write_tasks(path: Path, tasks: list[str]) -> None:
    """LeRobot's tasks table: the task string as the pandas index named `task`, `task_index` its
    row. A plain `task` column would load as task 0 for every frame (LeRobot reads the index), so the
    pandas metadata that makes `task` the index is written here, as pandas itself writes it."""
    pa, _ = _pyarrow()
    pandas_metadata = {
        "index_columns": ["task"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
             "metadata": {"encoding": "UTF-8"}},
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }  # fmt: skip
    _write_parquet(
        path,
        {"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), "task": pa.array(tasks, pa.string())},
        {b"pandas": json.dumps(pandas_metadata).encode()},
    )


def _write_episodes(
    path: Path,
    lengths: np.ndarray,
    fps: int,
    task: str,
    video_keys: dict[int, str],
    columns: dict[str, np.ndarray],
) -> None:
    pa, _ = _pyarrow()
    n = len(lengths)
    to_index = np.cumsum(lengths)
    from_index = to_index - lengths
    table: dict[str, Any] = {
        "episode_index": pa.array(np.arange(n, dtype=np.int64)),
        "tasks": pa.array([[task]] * n, pa.list_(pa.string())),
        "length": pa.array(lengths),
        "data/chunk_index": pa.array(np.zeros(n, np.int64)),
        "data/file_index": pa.array(np.zeros(n, np.int64)),
        "dataset_from_index": pa.array(from_index),
        "dataset_to_index": pa.array(to_index),
    }
    for key in video_keys.values():  # the episodes follow each other in one file per camera
        table[f"videos/{key}/chunk_index"] = pa.array(np.zeros(n, np.int64))
        table[f"videos/{key}/file_index"] = pa.array(np.zeros(n, np.int64))
        table[f"videos/{key}/from_timestamp"] = pa.array(from_index / fps)
        table[f"videos/{key}/to_timestamp"] = pa.array(to_index / fps)
    for name, values in columns.items():  # per-episode statistics, as LeRobot writes them
        per_episode = [_vector_stats(values[a:b]) for a, b in zip(from_index, to_index)]
        for stat in per_episode[0]:
            kind = pa.list_(pa.int64()) if stat == "count" else pa.list_(pa.float64())
            table[f"stats/{name}/{stat}"] = pa.array([s[stat] for s in per_episode], kind)
    table["meta/episodes/chunk_index"] = pa.array(np.zeros(n, np.int64))
    table["meta/episodes/file_index"] = pa.array(np.zeros(n, np.int64))
    _write_parquet(path, table)


def _vector_stats(values: np.ndarray) -> dict[str, list]:
    x = np.asarray(values, np.float64).reshape(len(values), -1)
    out = {
        "min": x.min(axis=0).tolist(),
        "max": x.max(axis=0).tolist(),
        "mean": x.mean(axis=0).tolist(),
        "std": x.std(axis=0).tolist(),
        "count": [len(x)],
    }
    for q in QUANTILES:
        out[f"q{int(round(q * 100)):02d}"] = np.quantile(x, q, axis=0).tolist()
    return out


def _write_video(
    path: Path, frames: FrameShardReader, rows: np.ndarray, fps: int, crf: int
) -> dict[str, list]:
    """Frame i of the file is row rows[i], at pts i / fps (H.264, yuv420p, one thread: the same
    bytes for the same frames); returns the frames' per-channel statistics in [0, 1], (3, 1, 1)."""
    import av
    import cv2

    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ExportError(
            f"frames of {frames.shape[2]} x {frames.shape[1]} pixels: H.264 in yuv420p needs an even width "
            "and height; convert with an even convert.image_size"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    total = np.zeros(3)
    total_sq = np.zeros(3)
    low, high = np.full(3, np.inf), np.full(3, -np.inf)
    pixels = 0
    histogram = np.zeros((3, 256), np.int64)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        height, width = frames.shape[1:3]
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        # One thread and, where it matters, no AVX-512 code paths: the same bytes for the same
        # frames (policypipe.h264 says what was measured).
        stream.codec_context.thread_count = 1
        stream.options = {"crf": str(crf), "preset": "medium", "g": "2", "x264-params": x264_params()}
        for i, row in enumerate(rows):
            rgb = frames.read(int(row))
            x = rgb.reshape(-1, 3).astype(np.float64) / 255.0
            total += x.sum(axis=0)
            total_sq += (x * x).sum(axis=0)
            low, high = np.minimum(low, x.min(axis=0)), np.maximum(high, x.max(axis=0))
            pixels += len(x)
            for c in range(3):
                histogram[c] += np.bincount(rgb[..., c].reshape(-1), minlength=256)
            # Converted by OpenCV, as the sample's recorder does.
            frame = av.VideoFrame.from_ndarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420), format="yuv420p")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    mean = total / pixels
    std = np.sqrt(np.maximum(total_sq / pixels - mean**2, 0.0))
    cumulative = np.cumsum(histogram, axis=1) / pixels
    stats = {"min": low, "max": high, "mean": mean, "std": std}
    for q in QUANTILES:
        stats[f"q{int(round(q * 100)):02d}"] = np.array(
            [np.searchsorted(cumulative[c], q) / 255.0 for c in range(3)]
        )
    out = {name: v.reshape(3, 1, 1).tolist() for name, v in stats.items()}
    out["count"] = [int(len(rows))]
    return out


def _features(
    names: list[str],
    cameras: list[int],
    video_keys: dict[int, str],
    image_size: tuple[int, int],
    fps: int,
) -> dict[str, Any]:
    width, height = image_size
    vector = {"dtype": "float32", "shape": [len(names)], "names": names}
    features: dict[str, Any] = {"observation.state": vector, "action": dict(vector)}
    for key in video_keys.values():
        features[key] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": "h264",
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for k in cameras[1:]:
        features[f"observation.camera{k}_valid"] = {"dtype": "bool", "shape": [1], "names": None}
    features |= {
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    return features
