"""The `convert` step: paired recordings -> one zarr dataset on the camera clock.

Each recording is converted in a worker process into a content-addressed cache entry (key:
the `_vio.mcap` SHA-256, the conversion params, a hash of the converter's source files and
the versions of the libraries that decide its pixels and numbers), so adding recordings
re-decodes only the new ones, and any change to the converter or those libraries re-decodes
everything. One recording that fails, in whatever way, is excluded with its reason; a full
disk stops the stage with the path and the space needed, and leaves no temporary file. The
store is then assembled from the cache, episode by episode in manifest order, under a temporary
name, and renamed into place: the result is
byte-identical whatever the number of workers, and a killed run leaves the previous store or
none. Memory holds one episode and one shard of frames at a time.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import zarr

from policypipe.atomic import canonical_json, write_bytes_atomic
from policypipe.dataset import layout
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import Episode, build_episode
from policypipe.dataset.frame_shards import FrameShardWriter, create_frames_array
from policypipe.dataset.image_codec import encode_jpeg
from policypipe.lineage.code import module_code_sha256
from policypipe.processes import process_pool
from policypipe.recordings.streams import RecordingError, read_streams

log = logging.getLogger(__name__)

# Distributions whose versions decide the converted pixels and numbers: decoders (OpenCV's
# bundled libjpeg/libpng, PyAV's FFmpeg), parsers (mcap, protobuf and the Foxglove schemas),
# interpolation (NumPy, SciPy) and the cache's own format (NumPy's npz). zarr writes the store.
DECISIVE_DISTRIBUTIONS = (
    "numpy",
    "scipy",
    "opencv-python-headless",
    "av",
    "zarr",
    "mcap",
    "protobuf",
    "foxglove-schemas-protobuf",
)


class DatasetError(Exception):
    """The dataset cannot be built as configured; the message says what to change."""


class DiskFullError(DatasetError):
    """No space left while writing `path`; `needed` bytes is what the write in hand needed."""

    def __init__(self, path: str, needed: int, frames: int) -> None:
        super().__init__(path, needed, frames)  # as args, so it crosses the process pool intact
        self.path, self.needed, self.frames = path, needed, frames

    def __str__(self) -> str:
        return f"no space left on the device writing {self.path} ({_mb(self.needed)} needed for it)"


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def converter_identity() -> dict[str, Any]:
    """What, besides the recording and the params, decides a converted episode's bytes."""
    import av
    import cv2

    return {
        "code_sha256": module_code_sha256(__name__),
        "libraries": {name: _distribution_version(name) for name in DECISIVE_DISTRIBUTIONS},
        # What is actually loaded: another OpenCV wheel or an FFmpeg build can sit under one name.
        "opencv": cv2.__version__,
        "ffmpeg": {lib: ".".join(map(str, v)) for lib, v in sorted(av.library_versions.items())},
    }


def converter_digest() -> str:
    return hashlib.sha256(canonical_json(converter_identity())).hexdigest()


@dataclass(frozen=True)
class RecordingInput:
    stem: str
    folder: str  # the session folder, relative to the export ('' at its root)
    vio_path: Path
    vio_sha256: str
    truncated: bool
    expected_frames: int | None


def recordings_from_manifest(manifest: dict[str, Any], export_root: Path) -> list[RecordingInput]:
    inputs = []
    for rec in manifest["recordings"]:
        frames = rec.get("status", {}).get("frames")
        inputs.append(
            RecordingInput(
                stem=rec["stem"],
                folder=rec["folder"],
                vio_path=export_root / rec["files"]["vio"]["path"],
                vio_sha256=rec["files"]["vio"]["sha256"],
                truncated=bool(rec.get("truncated", False)),
                expected_frames=frames if isinstance(frames, int) and not isinstance(frames, bool) else None,
            )
        )
    return inputs


def conversion_params(config: ConvertConfig) -> dict[str, Any]:
    """The params that determine the output (how many workers did it, and where, do not)."""
    params = asdict(config)
    for where in ("workers", "executor", "slurm"):
        params.pop(where)
    params["image_size"] = list(config.image_size)
    return params


def cache_key(rec: RecordingInput, config: ConvertConfig) -> str:
    # The record holds the stem and folder, the manifest's `truncated` and a warning from the status json's
    # frame count too: a renamed recording or a new status file must not be served the old ones.
    blob = canonical_json(
        {
            "converter": converter_digest(),
            "vio_sha256": rec.vio_sha256,
            "params": conversion_params(config),
            "stem": rec.stem,
            "folder": rec.folder,
            "truncated": rec.truncated,
            "expected_frames": rec.expected_frames,
        }
    )
    return hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------- one recording -> cache entry


def convert_recording(rec: RecordingInput, config: ConvertConfig, cache_dir: Path) -> dict[str, Any]:
    """Converts one recording into the cache (unless it is there) and returns its record.

    Never raises for what one recording contains: a RecordingError is a verdict on the data
    and is cached; any other exception (a decoder or library failure on input nobody
    foresaw) excludes the recording with the exception's last traceback line and is not
    cached, so a fixed converter tries again. Only a full disk stops the stage.
    """
    key = cache_key(rec, config)
    record_path = cache_dir / f"{key}.json"
    if (cached := _cached_record(record_path)) is not None:
        return cached
    record = record_of(rec, key)
    try:
        episode = build_episode(read_streams(rec.vio_path, config.topics), config)
        if rec.expected_frames is not None and rec.expected_frames != episode.frames_in:
            episode.warnings.append(
                f"status json says {rec.expected_frames} frames, "
                f"the recording has {episode.frames_in} (truncated copy?)"
            )
        _save_arrays(cache_dir / f"{key}.npz", episode, config.jpeg_quality)
    except RecordingError as exc:
        record |= {"excluded": exc.reason, "detail": str(exc)}
    except DiskFullError:
        raise
    except Exception as exc:  # noqa: BLE001 - one recording must never stop the others
        return record | _unexpected_failure(rec, exc)
    else:
        record |= {
            "start_ns": int(episode.capture_ns[0]),
            "frames": len(episode.capture_ns),
            "pose_samples": len(episode.pose_ns),
            "width_samples": len(episode.width_ns),
            "frames_in": episode.frames_in,
            "dropped": episode.dropped,
            "frequency_hz": round(episode.frequency_hz, 6),
            "camera_gaps": episode.camera_gaps,
            "camera_topic": episode.camera_topic,
            "lost_messages": episode.lost_messages,
            # Why reading stopped before the file's end (no index to skip the damage), or None.
            "read_stopped": episode.read_stopped,
            "resample_offset_ms": _offset_summary_ms(episode.resample_offset_ns),
            "warnings": episode.warnings,
        }
    # The record is written last: its presence means the entry is complete. It is returned as
    # read back, so a fresh and a cached conversion give the same attributes, key order included.
    blob = canonical_json(record)
    _write_cache_file(record_path, blob, frames=record.get("frames", 0))
    return json.loads(blob)


def _offset_summary_ms(offset_ns: np.ndarray | None) -> dict[str, float] | None:
    """How far from the resampling grid the chosen frames are (None: not resampled)."""
    if offset_ns is None:
        return None
    return {"mean": round(float(offset_ns.mean()) / 1e6, 3), "max": round(float(offset_ns.max()) / 1e6, 3)}


def record_of(rec: RecordingInput, key: str) -> dict[str, Any]:
    """What every record says of its recording, converted or excluded."""
    return {
        "stem": rec.stem,
        "folder": rec.folder,
        "vio_sha256": rec.vio_sha256,
        "truncated": rec.truncated,
        "key": key,
    }


def _cached_record(record_path: Path) -> dict[str, Any] | None:
    """The cached record, or None: an entry that cannot be read (a damaged disk, a hand edit) is
    a miss and is converted again."""
    try:
        record = json.loads(record_path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable cache entry, converting again: %s", record_path, exc)
        return None
    if "excluded" not in record and not record_path.with_suffix(".npz").is_file():
        log.warning("%s: cache entry without its arrays, converting again", record_path)
        return None
    return record


def _unexpected_failure(rec: RecordingInput, exc: Exception) -> dict[str, Any]:
    log.error("%s: conversion failed unexpectedly", rec.vio_path, exc_info=exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = (
        f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    )
    last_line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {
        "excluded": "converter_error",
        "detail": f"{last_line}{where}; please report it with this recording",
    }


def _is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_cache_file(path: Path, blob: bytes, frames: int) -> None:
    try:
        write_bytes_atomic(path, blob)
    except OSError as exc:
        if _is_disk_full(exc):
            raise DiskFullError(str(path), len(blob), frames) from None
        raise


def _save_arrays(path: Path, episode: Episode, jpeg_quality: int) -> None:
    # Frames are JPEG-encoded here, in the worker, in parallel: the cache stays small and the
    # store is assembled from these exact bytes without coding anything again.
    encoded = [encode_jpeg(frame, jpeg_quality) for frame in episode.rgb]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                jpeg=np.frombuffer(b"".join(encoded), dtype=np.uint8),
                jpeg_offsets=offsets,
                eef_pos=episode.eef_pos,
                eef_rot=episode.eef_rot_axis_angle,
                width=episode.gripper_width,
                capture_ns=episode.capture_ns,
                pose_ns=episode.pose_ns,
                pose_position=episode.pose_position,
                pose_rot=episode.pose_rot_axis_angle,
                width_ns=episode.width_ns,
                width_values=episode.width_values,
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and _is_disk_full(exc):
            # Frames, their low-dim rows, and the pose and width samples.
            needed = (
                int(offsets[-1])
                + 64 * len(episode.capture_ns)
                + 56 * len(episode.pose_ns)
                + 16 * len(episode.width_ns)
            )
            raise DiskFullError(str(path), needed, len(episode.capture_ns)) from None
        raise


def _load_arrays(cache_dir: Path, key: str) -> dict[str, np.ndarray]:
    with np.load(cache_dir / f"{key}.npz", allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# How the recordings get converted into the cache: here in a process pool (convert_recordings),
# or elsewhere (policypipe.cluster.convert_jobs: Slurm array tasks) into the same cache.
Runner = Callable[
    [list[RecordingInput], ConvertConfig, Path, Callable[[dict], None] | None], list[dict[str, Any]]
]


def convert_recordings(
    inputs: list[RecordingInput],
    config: ConvertConfig,
    cache_dir: Path,
    progress: Callable[[dict], None] | None = None,
) -> list[dict[str, Any]]:
    """Every recording into the cache by `config.workers` processes; their records in order."""
    # Always in worker processes, even one: a recording that kills its process (the kernel's
    # out-of-memory killer, a crash inside a decoder) must not take the stage with it.
    workers = min(config.workers or os.cpu_count() or 1, max(len(inputs), 1))
    # Forked: nothing here has started zarr's I/O thread yet (the store is written after).
    with process_pool(workers) as pool:
        futures = [pool.submit(convert_recording, r, config, cache_dir) for r in inputs]
        records = []
        try:
            for rec, future in zip(inputs, futures):
                try:
                    record = future.result()
                except BrokenProcessPool:
                    # A worker died (the kernel's out-of-memory killer, a crash inside a decoder):
                    # the pool is gone and which recording killed it is unknown. Every recording
                    # not finished yet gets a process of its own, so only the culprit is lost.
                    record = _convert_in_own_process(rec, config, cache_dir)
                records.append(_report(progress, record))
        except BaseException:
            # A full disk (or Ctrl-C): recordings not started yet never start; running ones fail
            # on the same disk, or finish, and remove their own temporary files before the pool is left.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        return records


def _convert_in_own_process(rec: RecordingInput, config: ConvertConfig, cache_dir: Path) -> dict[str, Any]:
    with process_pool(1) as pool:
        try:
            return pool.submit(convert_recording, rec, config, cache_dir).result()
        except BrokenProcessPool:
            log.error("%s: the conversion process died", rec.vio_path)
    # Not cached: a machine with more memory, or a fixed decoder, tries again.
    return record_of(rec, cache_key(rec, config)) | {
        "excluded": "worker_died",
        "detail": "the process converting it died (killed by the system, "
        "e.g. out of memory, or a crash inside a "
        "decoder); check the machine's memory and the recording",
    }


def _convert_all_or_disk_full(
    inputs: list[RecordingInput],
    config: ConvertConfig,
    cache_dir: Path,
    progress: Callable[[dict], None] | None,
    runner: Runner,
) -> list[dict[str, Any]]:
    try:
        return runner(inputs, config, cache_dir, progress)
    except DiskFullError as exc:
        # Scale what the failed entry needed to every recording not converted yet.
        todo = [r for r in inputs if not (cache_dir / f"{cache_key(r, config)}.json").is_file()]
        if exc.frames:  # the frames of a recording: scale by frame counts
            per_frame = exc.needed / exc.frames
            frames = sum(r.expected_frames or exc.frames for r in todo)
        else:  # a record file: one per recording
            per_frame, frames = exc.needed, len(todo)
        raise DatasetError(
            f"{exc}. The conversion cache needs about {_mb(per_frame * frames)} more for the {len(todo)} "
            f"recording(s) not converted yet, and {cache_dir} has "
            f"{_mb(shutil.disk_usage(cache_dir).free)} free. "
            "Free space there or point convert's --cache (dvc.yaml) at a larger disk, then run again: "
            "recordings already converted are kept."
        ) from None


def _report(progress: Callable[[dict], None] | None, record: dict) -> dict:
    if progress is not None:
        progress(record)
    return record


# ---------------------------------------------------------------- cache -> store


@dataclass(frozen=True)
class ConversionResult:
    episodes: list[dict[str, Any]]
    excluded: list[dict[str, Any]]
    frequency_hz: float
    frames: int
    store_bytes: int
    store_files: int

    def metrics(self) -> dict[str, Any]:
        dropped: Counter[str] = Counter()
        lost: Counter[str] = Counter()
        for ep in self.episodes:
            dropped.update(ep["dropped"])
            dropped["camera_gap"] += ep["camera_gaps"]
            lost.update(ep["lost_messages"])
        return {
            "episodes": len(self.episodes),
            "frames": self.frames,
            "frequency_hz": self.frequency_hz,
            "frames_dropped_by_reason": dict(sorted(dropped.items())),
            # Messages in damaged chunks or unparseable, per stream: the file lost them, not convert.
            "messages_lost_by_stream": dict(sorted(lost.items())),
            "episodes_from_damaged_files": sum(
                1 for ep in self.episodes if ep["lost_messages"] or ep["read_stopped"]
            ),
            "episodes_read_only_up_to_damage": sum(1 for ep in self.episodes if ep["read_stopped"]),
            "recordings_excluded": len(self.excluded),
            "recordings_excluded_by_reason": dict(
                sorted(Counter(e["excluded"] for e in self.excluded).items())
            ),
            # With convert.resample_hz: the farthest any chosen frame is from its grid time.
            "resample_offset_ms_max": max(
                (ep["resample_offset_ms"]["max"] for ep in self.episodes if ep["resample_offset_ms"]),
                default=None,
            ),
            "bytes_per_frame": round(self.store_bytes / max(self.frames, 1), 1),
            "store_files": self.store_files,
        }

    def report(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "excluded": self.excluded}


def convert_dataset(
    manifest_path: Path,
    export_root: Path,
    out_path: Path,
    cache_dir: Path,
    config: ConvertConfig,
    progress: Callable[[dict], None] | None = None,
    runner: Runner = convert_recordings,
) -> ConversionResult:
    """The store at `out_path` from the manifest's recordings, through the cache; `runner`
    converts what the cache lacks (the store is assembled here either way, so its bytes do not
    depend on where the conversion ran)."""
    manifest = json.loads(Path(manifest_path).read_text())
    inputs = recordings_from_manifest(manifest, Path(export_root))
    if not inputs:
        raise DatasetError(
            f"{manifest_path} lists no recordings: nothing to convert (see the pair stage's report)"
        )
    cache_dir = _current_cache(Path(cache_dir))

    records = _convert_all_or_disk_full(inputs, config, cache_dir, progress, runner)
    episodes = [r for r in records if "excluded" not in r]
    excluded = [r for r in records if "excluded" in r]
    if not episodes:
        reasons = "; ".join(f"{r['stem']}: {r['detail']}" for r in excluded[:5])
        raise DatasetError(f"no recording could be converted ({reasons})")

    frequency = _dataset_frequency(episodes, config)
    _assemble(out_path, episodes, cache_dir, config, frequency)
    files = [p for p in out_path.rglob("*") if p.is_file()]
    return ConversionResult(
        episodes=episodes,
        excluded=excluded,
        frequency_hz=frequency,
        frames=sum(ep["frames"] for ep in episodes),
        store_bytes=sum(p.stat().st_size for p in files),
        store_files=len(files),
    )


_CACHE_FOLDER = re.compile(r"[0-9a-f]{16}|v[0-9]+")


def _current_cache(cache_root: Path) -> Path:
    """The cache folder of this converter (code and libraries); other converters' entries can
    never be hit again, so their folders are removed."""
    current = cache_root / converter_digest()[:16]
    if cache_root.is_dir():
        for other in cache_root.iterdir():
            # Only folders named as this function names them (and the old v1, v2, ...): a
            # --cache pointed at a folder that holds anything else must not lose it.
            if other != current and other.is_dir() and _CACHE_FOLDER.fullmatch(other.name):
                shutil.rmtree(other, ignore_errors=True)
        for stale in current.glob(".*.tmp*") if current.is_dir() else ():
            stale.unlink(missing_ok=True)  # left by a worker that was killed mid-write
    current.mkdir(parents=True, exist_ok=True)
    return current


def _dataset_frequency(episodes: list[dict[str, Any]], config: ConvertConfig) -> float:
    if config.resample_hz is not None:
        return float(config.resample_hz)
    frequency = round(median(ep["frequency_hz"] for ep in episodes), 6)
    off = [
        f"{ep['stem']} ({ep['frequency_hz']:.2f} Hz)"
        for ep in episodes
        if abs(ep["frequency_hz"] - frequency) > config.frequency_tolerance * frequency
    ]
    if off:
        raise DatasetError(
            f"episodes recorded at another rate than the dataset's {frequency:.2f} Hz "
            f"(tolerance {config.frequency_tolerance:.0%}): {', '.join(off)}. "
            "Set convert.resample_hz to resample every episode onto one grid, or remove them from the export."
        )
    return frequency


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


def _assemble(
    out_path: Path, episodes: list[dict[str, Any]], cache_dir: Path, config: ConvertConfig, frequency: float
) -> None:
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    for stale in out_path.parent.glob(f".{out_path.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
    try:
        _write_store(tmp, episodes, cache_dir, config, frequency)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and _is_disk_full(exc):
            needed = sum((cache_dir / f"{ep['key']}.npz").stat().st_size for ep in episodes)
            raise DatasetError(
                f"no space left on the device writing the dataset {out_path}: it needs about {_mb(needed)}, "
                f"and {out_path.parent} has "
                f"{_mb(shutil.disk_usage(out_path.parent).free)} free. Free space there "
                "and run again (the conversion cache is kept; the previous dataset, if any, is untouched)."
            ) from None
        raise
    _replace_dir(tmp, out_path)


def _write_store(
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
        arrays = _load_arrays(cache_dir, ep["key"])
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


def _replace_dir(tmp: Path, out_path: Path) -> None:
    old = out_path.with_name(f".{out_path.name}.old-{os.getpid()}")
    if out_path.exists():
        os.replace(out_path, old)
    os.replace(tmp, out_path)
    shutil.rmtree(old, ignore_errors=True)
