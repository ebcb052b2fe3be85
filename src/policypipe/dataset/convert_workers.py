"""Recordings -> cache entries, each converted in a process of its own.

One recording that fails, in whatever way (a verdict on its data, a library that crashes on it,
a worker killed by the OS), is excluded with its reason and the others go on. A full disk stops
the whole conversion with the path and the space needed, and leaves no temporary file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from policypipe.atomic import canonical_json
from policypipe.dataset import layout
from policypipe.dataset.convert_cache import (
    RecordingInput,
    cache_key,
    cached_record,
    jpeg_arrays,
    record_of,
    save_arrays,
    write_arrays,
    write_cache_file,
)
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import CameraEpisode, build_episode, measured_frequency, missing_frames
from policypipe.dataset.errors import DatasetError, DiskFullError, megabytes
from policypipe.dataset.joint import build_joint_episode, joint_arrays
from policypipe.processes import each_in_own_process, process_pool
from policypipe.recordings.aloha import ALOHA, read_aloha
from policypipe.recordings.aloha import EpisodeSource as AlohaSource
from policypipe.recordings.hdf5 import DemoSource, read_demo_streams
from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import read_streams

log = logging.getLogger(__name__)

# How the recordings get converted into the cache: here in a process pool (convert_recordings),
# or elsewhere (policypipe.cluster.convert_jobs: Slurm array tasks) into the same cache.
Runner = Callable[
    [list[RecordingInput], ConvertConfig, Path, Callable[[dict], None] | None], list[dict[str, Any]]
]

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
    if (cached := cached_record(record_path)) is not None:
        return cached
    record = record_of(rec, key)
    try:
        if rec.source is not None and rec.source["format"] == ALOHA:
            summary = _convert_joint(rec, config, cache_dir / f"{key}.npz")
        else:
            summary = _convert_poses(rec, config, cache_dir / f"{key}.npz")
    except RecordingError as exc:
        record |= {"excluded": exc.reason, "detail": str(exc)}
    except DiskFullError:
        raise
    except Exception as exc:  # noqa: BLE001 - one recording must never stop the others
        return record | _unexpected_failure(rec, exc)
    else:
        record |= summary
    # The record is written last: its presence means the entry is complete. It is returned as
    # read back, so a fresh and a cached conversion give the same attributes, key order included.
    blob = canonical_json(record)
    write_cache_file(record_path, blob, frames=record.get("frames", 0))
    return json.loads(blob)


def _convert_poses(rec: RecordingInput, config: ConvertConfig, npz: Path) -> dict[str, Any]:
    """A recording (or a robomimic demo) of gripper poses into the cache; its record's summary."""
    if rec.source is not None:
        demo = DemoSource.from_json(rec.source)
        streams = read_demo_streams(rec.vio_path, demo, config.grippers, config.cameras)
    else:
        streams = read_streams(rec.vio_path, config.topics, config.grippers, config.cameras)
    episode = build_episode(streams, config)
    if rec.expected_frames is not None and rec.expected_frames != episode.frames_in:
        episode.warnings.append(
            f"status json says {rec.expected_frames} frames, "
            f"the recording has {episode.frames_in} (truncated copy?)"
        )
    save_arrays(npz, episode, config.jpeg_quality)
    summary = {
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
    for i, gripper in episode.grippers.items():
        if i != 0:
            summary |= {
                f"robot{i}_pose_samples": len(gripper.pose_ns),
                f"robot{i}_width_samples": len(gripper.width_ns),
            }
    if episode.cameras:
        summary["cameras"] = {f"camera{k}": _camera_summary(c) for k, c in episode.cameras.items()}
    return summary


def _convert_joint(rec: RecordingInput, config: ConvertConfig, npz: Path) -> dict[str, Any]:
    """An ALOHA episode (joint space) into the cache; its record's summary, as a recording's has it."""
    if config.resample_hz is not None:
        raise RecordingError(
            "resample_unsupported",
            "convert.resample_hz is set: an ALOHA episode's rows are its control steps, already on a grid; "
            "set it to null",
        )
    source = AlohaSource.from_json(rec.source)
    streams = read_aloha(rec.vio_path, source, config.cameras)
    try:
        episode = build_joint_episode(streams, config)
    finally:
        streams.close()
    write_arrays(
        npz,
        joint_arrays(episode, partial(jpeg_arrays, jpeg_quality=config.jpeg_quality)),
        len(episode.capture_ns),
    )
    n = len(episode.capture_ns)
    return {
        "representation": layout.JOINT_REPRESENTATION,
        "joint_names": list(source.joint_names),
        "start_ns": int(episode.capture_ns[0]),
        "frames": n,
        "frames_in": episode.frames_in,
        "dropped": episode.dropped,
        "frequency_hz": round(measured_frequency(episode.capture_ns), 6),
        "camera_gaps": missing_frames(episode.capture_ns),
        "camera_topic": episode.camera_topic,
        "lost_messages": {},
        "read_stopped": None,
        "resample_offset_ms": None,
        "warnings": episode.warnings,
        "cameras": {
            # As a recording's cameras are summarised (`_camera_summary`): here they share the rows.
            f"camera{k}": {
                "topic": episode.camera_topics[k] or None,
                "frames_in": int(valid.sum()),
                "frequency_hz": source.control_hz if valid.any() else None,
                "gaps": 0,
                "dropped": {},
                "rows_missing": int((~valid).sum()),
                "offset_ms": {"mean_abs": 0.0, "max_abs": 0.0}
                if valid.any()
                else {"mean_abs": None, "max_abs": None},
            }
            for k, valid in episode.valid.items()
        },
    }


def _offset_summary_ms(offset_ns: np.ndarray | None) -> dict[str, float] | None:
    """How far from the resampling grid the chosen frames are (None: not resampled)."""
    if offset_ns is None:
        return None
    return {"mean": round(float(offset_ns.mean()) / 1e6, 3), "max": round(float(offset_ns.max()) / 1e6, 3)}


def _camera_summary(camera: CameraEpisode) -> dict[str, Any]:
    """A camera beyond camera 0 in one episode: its own rate and gaps, and how far its chosen frames
    are from the rows they fill."""
    offset_ms = np.abs(camera.offset_ns[camera.valid]) / 1e6
    frequency = camera.frequency_hz
    return {
        "topic": camera.topic or None,  # None: absent from the recording
        "frames_in": camera.frames_in,
        "frequency_hz": None if frequency is None else round(frequency, 6),
        "gaps": camera.gaps,
        "dropped": camera.dropped,
        "rows_missing": int((~camera.valid).sum()),
        "offset_ms": {
            "mean_abs": round(float(offset_ms.mean()), 3) if len(offset_ms) else None,
            "max_abs": round(float(offset_ms.max()), 3) if len(offset_ms) else None,
        },
    }


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
    records: list[dict[str, Any]] = []
    with process_pool(workers) as pool:
        futures = [pool.submit(convert_recording, r, config, cache_dir) for r in inputs]
        # A full disk (or Ctrl-C) leaves the pool: recordings not started yet never start; running
        # ones fail on the same disk, or finish, and remove their own temporary files before it is left.
        try:
            for future in futures:
                records.append(_report(progress, future.result()))
        except BrokenProcessPool:
            pass  # a worker died: below
    # A worker died (the kernel's out-of-memory killer, a crash inside a decoder): the pool is gone
    # and which recording killed it is unknown. Every recording not reported yet gets a process of
    # its own, still `workers` at a time, so only the culprit is lost (one done already is a cache hit).
    remaining = inputs[len(records) :]
    convert_one = partial(convert_recording, config=config, cache_dir=cache_dir)
    for rec, record in zip(remaining, each_in_own_process(convert_one, remaining, workers)):
        records.append(_report(progress, _died(rec, config) if record is None else record))
    return records


def _died(rec: RecordingInput, config: ConvertConfig) -> dict[str, Any]:
    log.error("%s: the conversion process died", rec.vio_path)
    # Not cached: a machine with more memory, or a fixed decoder, tries again.
    return record_of(rec, cache_key(rec, config)) | {
        "excluded": "worker_died",
        "detail": "the process converting it died (killed by the system, "
        "e.g. out of memory, or a crash inside a "
        "decoder); check the machine's memory and the recording",
    }


def convert_all_or_disk_full(
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
            f"{exc}. The conversion cache needs about {megabytes(per_frame * frames)} more "
            f"for the {len(todo)} recording(s) not converted yet, and {cache_dir} has "
            f"{megabytes(shutil.disk_usage(cache_dir).free)} free. "
            "Free space there or point convert's --cache (dvc.yaml) at a larger disk, then run again: "
            "recordings already converted are kept."
        ) from None


def _report(progress: Callable[[dict], None] | None, record: dict) -> dict:
    if progress is not None:
        progress(record)
    return record
