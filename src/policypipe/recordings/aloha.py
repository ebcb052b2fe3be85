"""ALOHA / RDT HDF5 files as a source (docs/interop.md, "Import: ALOHA and RDT HDF5").

One file is one episode, in the layout of ACT's `record_episodes.py`:
- `observations/qpos` (N, D): the follower arms' joint positions, D = 14 for bimanual ALOHA (per arm
  six joints, then the gripper);
- `action` (N, D): the commanded joint positions (the leader arms'), at the same rows;
- `observations/images/<camera>`: per row a frame, either raw uint8 (N, H, W, 3), or JPEG bytes:
  rows padded to one length (N, L) with `compress_len` (cameras, N) giving each frame's bytes, or
  variable-length byte strings (RDT's writers).
The rate is not in the file: `pair.aloha.control_hz` is required (50 Hz for ALOHA).

Joint space: the episode is absolute vectors with named dimensions (`pair.aloha.joint_names`), not
gripper poses, so it becomes a joint-space episode (`dataset.joint`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from policypipe.recordings.hdf5 import Hdf5Rejected
from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import CameraStream

ALOHA = "aloha"
# Bimanual ALOHA's qpos and action, in order (ACT's constants: per arm, six joints and the gripper).
ALOHA_JOINTS = tuple(
    f"{arm}_{joint}"
    for arm in ("left", "right")
    for joint in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")
)
STATE_KEY = "observations/qpos"
ACTION_KEY = "action"
IMAGES = "observations/images"


@dataclass(frozen=True)
class AlohaConfig:
    """`pair.aloha` in params.yaml: how to read the files when `pair.source` is aloha."""

    # Camera k of the dataset is the k-th of these (observations/images/<name>).
    cameras: tuple[str, ...] = ("cam_high", "cam_left_wrist", "cam_right_wrist")
    # The rows' rate (Hz): required, the files do not hold it.
    control_hz: float | None = None
    # qpos's and action's dimensions, in order (None: ALOHA_JOINTS); those named *gripper* are the grippers.
    joint_names: tuple[str, ...] | None = None
    # JPEG frames: the channel order of the arrays that were encoded. ACT and RDT encode RGB arrays
    # with OpenCV, so decoding with OpenCV gives RGB back ("rgb"); "bgr" for BGR arrays.
    jpeg_channels: Literal["rgb", "bgr"] = "rgb"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "joint_names", tuple(self.joint_names or ALOHA_JOINTS))
        if not self.cameras:
            raise ValueError(
                "pair.aloha.cameras must name at least one camera (camera 0: the dataset's clock)"
            )
        if self.control_hz is not None and not self.control_hz > 0:
            raise ValueError(f"pair.aloha.control_hz must be > 0 Hz, got {self.control_hz}")
        if len(set(self.joint_names)) != len(self.joint_names) or not self.joint_names:
            raise ValueError(f"pair.aloha.joint_names must be distinct names, got {list(self.joint_names)}")

    def required_rate(self) -> float:
        if self.control_hz is None:
            raise ValueError(
                "pair.aloha.control_hz is required: ALOHA files do not hold their rate (50 Hz for ALOHA's "
                "own recordings); set it in params.yaml [pair] aloha"
            )
        return float(self.control_hz)


@dataclass(frozen=True)
class EpisodeSource:
    """What the manifest says of one ALOHA file, for convert to read it."""

    control_hz: float
    cameras: tuple[str, ...]
    joint_names: tuple[str, ...]
    jpeg_channels: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ALOHA,
            "control_hz": self.control_hz,
            "cameras": list(self.cameras),
            "joint_names": list(self.joint_names),
            "jpeg_channels": self.jpeg_channels,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> EpisodeSource:
        return cls(
            float(value["control_hz"]),
            tuple(value["cameras"]),
            tuple(value["joint_names"]),
            value["jpeg_channels"],
        )


def aloha_inventory(path: Path, config: AlohaConfig) -> tuple[int, EpisodeSource]:
    """The rows and source of one ALOHA file; Hdf5Rejected says why it cannot serve."""
    import h5py

    rate = config.required_rate()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise Hdf5Rejected("not_hdf5", f"not an HDF5 file h5py can open ({exc})") from None
    with f:
        missing = [k for k in (STATE_KEY, ACTION_KEY, f"{IMAGES}/{config.cameras[0]}") if k not in f]
        if missing:
            images = sorted(f[IMAGES]) if isinstance(f.get(IMAGES), h5py.Group) else []
            raise Hdf5Rejected(
                "missing_keys",
                f"no {', '.join(missing)} (its cameras: {', '.join(images) or 'none'}): not an ALOHA "
                "episode, or pair.aloha.cameras names another camera 0",
            )
        state, action = f[STATE_KEY], f[ACTION_KEY]
        dims = len(config.joint_names)
        if state.ndim != 2 or state.shape[1] != dims or action.shape != state.shape:
            raise Hdf5Rejected(
                "missing_keys",
                f"{STATE_KEY} is {state.shape} and {ACTION_KEY} {action.shape}; pair.aloha.joint_names has "
                f"{dims} names: both must be (N, {dims})",
            )
        rows = int(state.shape[0])
    return rows, EpisodeSource(rate, config.cameras, config.joint_names, config.jpeg_channels)


@dataclass
class JointStreams:
    """One ALOHA episode: its rows' times, joint vectors and cameras (absent ones listed)."""

    ns: np.ndarray  # int64 (N,), row t at t / control_hz
    state: np.ndarray  # float64 (N, D)
    action: np.ndarray  # float64 (N, D)
    cameras: dict[int, CameraStream]
    missing_cameras: tuple[int, ...]
    camera_sources: dict[int, str]
    h5: Any = None  # the open file the lazy camera rows read from; closed with `close`

    def close(self) -> None:
        if self.h5 is not None:
            self.h5.close()
            self.h5 = None


class _Rows(Sequence):
    """A camera's frames, read from the open file one row at a time (raw ALOHA frames are ~1 MB
    each: an episode's would not fit in memory at once)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return int(self.dataset.shape[0])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self.dataset[i]
        return row.tobytes() if isinstance(row, np.ndarray) and row.ndim == 1 else row  # JPEG: bytes


def read_aloha(path: Path, source: EpisodeSource, cameras: tuple[int, ...] = (0,)) -> JointStreams:
    """One ALOHA file's episode; the file stays open for its camera rows until `close`."""
    import h5py

    f = h5py.File(path, "r")
    try:
        state = np.asarray(f[STATE_KEY][()], np.float64)
        action = np.asarray(f[ACTION_KEY][()], np.float64)
        rows = len(state)
        if state.ndim != 2 or state.shape[1] != len(source.joint_names) or action.shape != state.shape:
            raise RecordingError(
                "bad_message", f"{STATE_KEY} {state.shape} and {ACTION_KEY} {action.shape}: both (N, D)"
            )
        bad = ~np.isfinite(state).all(axis=1) | ~np.isfinite(action).all(axis=1)
        if bad.any():
            raise RecordingError(
                "bad_message",
                f"{int(bad.sum())} rows of {STATE_KEY} or {ACTION_KEY} are not finite "
                f"(the first: row {int(np.argmax(bad))})",
            )
        ns = np.round(np.arange(rows) * (1e9 / source.control_hz)).astype(np.int64)
        found, missing, looked = {}, [], {}
        for k in cameras:
            name = source.cameras[k] if k < len(source.cameras) else None
            looked[k] = f"{IMAGES}/{name}" if name else f"pair.aloha.cameras names no camera {k}"
            key = f"{IMAGES}/{name}"
            if name is None or key not in f:
                if k == 0:
                    raise RecordingError("missing_topic", f"no {key} in {path.name} (camera 0)")
                missing.append(k)
                continue
            images = f[key]
            if images.shape[0] != rows:
                raise RecordingError("bad_message", f"{key} has {images.shape[0]} rows, {STATE_KEY} {rows}")
            if images.dtype == np.uint8 and images.ndim == 4:
                found[k] = CameraStream(key, ns, _Rows(images), "rgb")
                continue
            # JPEG rows: zero-padded to one length (N, L), or variable-length byte strings. A padded
            # row is decoded whole: the decoder stops at the image's end marker, as ACT's loader
            # relies on (its `compress_len` lists the cameras in the recorder's own order).
            jpeg = "jpeg_rgb" if source.jpeg_channels == "rgb" else "jpeg"
            found[k] = CameraStream(key, ns, _Rows(images), jpeg)
    except BaseException:
        f.close()
        raise
    return JointStreams(ns, state, action, found, tuple(missing), looked, f)
