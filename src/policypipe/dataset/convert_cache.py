"""The conversion cache: one entry per recording, content-addressed.

An entry's key is the `_vio.mcap` SHA-256, the conversion params, a hash of the converter's source
files and the versions of the libraries that decide its pixels and numbers, so adding recordings
re-decodes only the new ones, and any change to the converter or those libraries re-decodes
everything. An entry is a JSON record (the verdict, and the episode's summary) and, for a kept
episode, an `.npz` of its arrays with the frames as JPEG.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policypipe.atomic import canonical_json, write_bytes_atomic
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import Episode
from policypipe.dataset.errors import DiskFullError, is_disk_full
from policypipe.dataset.image_codec import encode_jpeg
from policypipe.lineage.code import module_code_sha256

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
    "h5py",
    "mcap",
    "protobuf",
    "foxglove-schemas-protobuf",
)


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
        # The whole converter: the conversion entry module and everything it imports.
        "code_sha256": module_code_sha256("policypipe.dataset.convert"),
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
    # An HDF5 demo (pair.source robomimic): the manifest's `source`, `recordings.hdf5.DemoSource`;
    # vio_path and vio_sha256 are then its file's. None: a studio recording's `_vio.mcap`.
    source: dict[str, Any] | None = None


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
        | ({"source": rec.source} if rec.source is not None else {})
    )
    return hashlib.sha256(blob).hexdigest()


def record_of(rec: RecordingInput, key: str) -> dict[str, Any]:
    """What every record says of its recording, converted or excluded."""
    record = {
        "stem": rec.stem,
        "folder": rec.folder,
        "vio_sha256": rec.vio_sha256,
        "truncated": rec.truncated,
        "key": key,
    }
    if rec.source is not None:  # the lineage of an HDF5 demo: its file's path and its key inside it
        record |= {"source": {k: rec.source[k] for k in ("format", "path", "key") if k in rec.source}}
    return record


def cached_record(record_path: Path) -> dict[str, Any] | None:
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


def write_cache_file(path: Path, blob: bytes, frames: int) -> None:
    try:
        write_bytes_atomic(path, blob)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFullError(str(path), len(blob), frames) from None
        raise


def camera_prefix(k: int) -> str:
    """What camera k's arrays in a cache entry are named with: camera 0's have their version 1
    names, without a prefix."""
    return "" if k == 0 else f"camera{k}_"


def episode_arrays(episode: Episode, jpeg_quality: int) -> dict[str, np.ndarray]:
    """The arrays of a cache entry: camera 0's frames as JPEG and gripper 0's values under their
    version 1 names; another gripper's under `robot{i}_`, another camera's under `camera_prefix`."""
    arrays = {
        **jpeg_arrays(episode.rgb, jpeg_quality, camera_prefix(0)),
        "capture_ns": episode.capture_ns,
    }
    for i, gripper in episode.grippers.items():
        prefix = "" if i == 0 else f"robot{i}_"
        arrays |= {
            f"{prefix}eef_pos": gripper.eef_pos,
            f"{prefix}eef_rot": gripper.eef_rot_axis_angle,
            f"{prefix}width": gripper.gripper_width,
            f"{prefix}pose_ns": gripper.pose_ns,
            f"{prefix}pose_position": gripper.pose_position,
            f"{prefix}pose_rot": gripper.pose_rot_axis_angle,
            f"{prefix}width_ns": gripper.width_ns,
            f"{prefix}width_values": gripper.width_values,
        }
    for k, camera in episode.cameras.items():
        prefix = camera_prefix(k)
        arrays |= {
            **jpeg_arrays(camera.rgb, jpeg_quality, prefix),
            f"{prefix}offset_ns": camera.offset_ns,
            f"{prefix}valid": camera.valid,
        }
    return arrays


def jpeg_arrays(rgb: np.ndarray, jpeg_quality: int, prefix: str) -> dict[str, np.ndarray]:
    """Frames as a cache entry holds them: their JPEG bytes end to end, and where each starts."""
    encoded = [encode_jpeg(frame, jpeg_quality) for frame in rgb]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    return {
        f"{prefix}jpeg": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        f"{prefix}jpeg_offsets": offsets,
    }


def save_arrays(path: Path, episode: Episode, jpeg_quality: int) -> None:
    # Frames are JPEG-encoded here, in the worker, in parallel: the cache stays small and the
    # store is assembled from these exact bytes without coding anything again.
    write_arrays(path, episode_arrays(episode, jpeg_quality), len(episode.capture_ns))


def write_arrays(path: Path, arrays: dict[str, np.ndarray], frames: int) -> None:
    """A cache entry's arrays, written to a temporary name, synced, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            needed = sum(a.nbytes for a in arrays.values())
            raise DiskFullError(str(path), needed, frames) from None
        raise


def load_arrays(cache_dir: Path, key: str) -> dict[str, np.ndarray]:
    with np.load(cache_dir / f"{key}.npz", allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


CACHE_FOLDER = re.compile(r"[0-9a-f]{16}|v[0-9]+")


def current_cache(cache_root: Path) -> Path:
    """The cache folder of this converter (code and libraries); other converters' entries can
    never be hit again, so their folders are removed."""
    current = cache_root / converter_digest()[:16]
    if cache_root.is_dir():
        for other in cache_root.iterdir():
            # Only folders named as this function names them (and the old v1, v2, ...): a
            # --cache pointed at a folder that holds anything else must not lose it.
            if other != current and other.is_dir() and CACHE_FOLDER.fullmatch(other.name):
                shutil.rmtree(other, ignore_errors=True)
        for stale in current.glob(".*.tmp*") if current.is_dir() else ():
            stale.unlink(missing_ok=True)  # left by a worker that was killed mid-write
    current.mkdir(parents=True, exist_ok=True)
    return current
