"""robomimic / MimicGen HDF5 files as a source beside the MCAP export (docs/interop.md, "Import").

One file holds many demonstrations: `data/demo_N` groups, each with `obs/<key>` arrays of one row
per control step, and `data.attrs["env_args"]` (JSON) whose `env_kwargs.control_freq` is the rate
the rows were recorded at. `mask/<filter>` lists the demos of a named subset ("train", "valid",
"20_percent", ...).

Two halves, one per stage:
- `inventory` (the `pair` stage): which demos a file holds, in numeric order (demo_2 before
  demo_10, which a text sort puts first), the filter honoured, and why a file or demo cannot be
  read. What convert needs to read a demo travels in the manifest (`DemoSource`).
- `read_demo_streams` (the `convert` stage): one demo as the `Streams` an MCAP recording gives, so
  it becomes an episode by the same code: same quality rules, interpolation, resampling, cache.

What is read, per gripper i (robomimic's `robot{i}_` keys; `pair.robomimic` names gripper 0's):
- the pose: `robot0_eef_pos` (m) and `robot0_eef_quat` (x, y, z, w, as robosuite writes it), the
  end effector in the robot's base frame. The demos' `actions` are usually delta OSC commands;
  they are not read: like the handheld gripper's, the policy learns the recorded poses;
- the width: `robot0_gripper_qpos` holds the two finger joints (Panda: each finger's distance
  from the centre, the left one positive, the right one negative), so the opening is their
  difference, `qpos[:, 0] - qpos[:, 1]` (m);
- camera k: the k-th name of `pair.robomimic.cameras` (`agentview_image`, ...), uint8 RGB rows as stored.
Every sample of row t is stamped t / control_hz s: the rows are the control steps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import CameraStream, GripperStreams, Streams

SUFFIXES = (".hdf5", ".h5")
ROBOMIMIC = "robomimic"
_DEMO = re.compile(r"demo_(\d+)")


@dataclass(frozen=True)
class RobomimicConfig:
    """`pair.robomimic` in params.yaml: how to read the HDF5 files when `pair.source` is robomimic."""

    # mask/<filter_key>: only the demos it lists (null: every demo of data/).
    filter_key: str | None = None
    # Camera k of the dataset is the k-th of these obs keys (convert.cameras picks which are kept).
    cameras: tuple[str, ...] = ("agentview_image",)
    position: str = "robot0_eef_pos"
    quaternion: str = "robot0_eef_quat"
    gripper: str = "robot0_gripper_qpos"
    # The rows' rate (Hz) when a file's env_args does not give env_kwargs.control_freq.
    control_hz: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple(self.cameras))
        if not self.cameras:
            raise ValueError(
                "pair.robomimic.cameras must name at least one obs key (camera 0: the dataset's clock)"
            )
        if self.control_hz is not None and not self.control_hz > 0:
            raise ValueError(
                f"pair.robomimic.control_hz must be > 0 Hz (or null: the file's), got {self.control_hz}"
            )

    def keys_of(self, gripper: int) -> tuple[str, str, str]:
        """Gripper i's position, quaternion and finger-joint keys: gripper 0's with robot{i}_."""
        return tuple(_robot_key(key, gripper) for key in (self.position, self.quaternion, self.gripper))  # type: ignore[return-value]


def _robot_key(key: str, gripper: int) -> str:
    return key.replace("robot0_", f"robot{gripper}_", 1) if gripper else key


@dataclass(frozen=True)
class DemoSource:
    """What the manifest says of one demo, for convert to read it (`RecordingInput.source`)."""

    key: str  # the demo's group inside the file, e.g. "data/demo_3"
    control_hz: float
    cameras: tuple[str, ...]
    position: str
    quaternion: str
    gripper: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ROBOMIMIC,
            "key": self.key,
            "control_hz": self.control_hz,
            "cameras": list(self.cameras),
            "position": self.position,
            "quaternion": self.quaternion,
            "gripper": self.gripper,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> DemoSource:
        fields = {k: v for k, v in value.items() if k not in ("format", "path")}
        return cls(**{**fields, "cameras": tuple(fields["cameras"])})


class Hdf5Rejected(Exception):
    """A file none of whose demos can be read; `reason` is the report's code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Demo:
    key: str
    frames: int
    source: DemoSource


def robomimic_inventory(path: Path, config: RobomimicConfig) -> tuple[list[Demo], list[tuple[str, str, str]]]:
    """The readable demos of one robomimic file, in numeric order, and (key, reason, detail) for
    each demo that is not. Raises Hdf5Rejected when the file as a whole cannot serve."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise Hdf5Rejected("not_hdf5", f"not an HDF5 file h5py can open ({exc})") from None
    with f:
        data = f.get("data")
        if not isinstance(data, h5py.Group):
            raise Hdf5Rejected(
                "not_robomimic",
                "no data/ group: not a robomimic or MimicGen file (their demos are data/demo_N)",
            )
        names = [name for name in data if _DEMO.fullmatch(name)]
        if config.filter_key is not None:
            mask = f.get(f"mask/{config.filter_key}")
            if mask is None:
                have = sorted(f["mask"]) if isinstance(f.get("mask"), h5py.Group) else []
                raise Hdf5Rejected(
                    "no_filter",
                    f"no mask/{config.filter_key} in the file (it has {', '.join(have) or 'no masks'}): "
                    "set pair.robomimic.filter_key to one of them, or null for every demo",
                )
            listed = [n.decode() if isinstance(n, bytes) else str(n) for n in mask[()]]
            unknown = sorted(set(listed) - set(names))
            if unknown:
                raise Hdf5Rejected(
                    "no_filter",
                    f"mask/{config.filter_key} lists demos the file lacks: {', '.join(unknown[:5])}",
                )
            names = listed
        names = sorted(set(names), key=lambda n: int(_DEMO.fullmatch(n)[1]))  # type: ignore[index]
        if not names:
            raise Hdf5Rejected("no_demos", "data/ holds no demo_N group")
        control_hz = _control_rate(data, config)
        demos, rejected = [], []
        for name in names:
            group = data[name]
            missing = [
                key
                for key in (config.position, config.quaternion, config.gripper, config.cameras[0])
                if f"obs/{key}" not in group
            ]
            if missing:
                have = sorted(group["obs"]) if isinstance(group.get("obs"), h5py.Group) else []
                rejected.append(
                    (
                        f"data/{name}",
                        "missing_keys",
                        f"no obs/{', obs/'.join(missing)} (it has: {', '.join(have) or 'no obs/ group'}); "
                        "name the file's keys in pair.robomimic",
                    )
                )
                continue
            source = DemoSource(
                f"data/{name}", control_hz, config.cameras, config.position, config.quaternion, config.gripper
            )
            demos.append(Demo(f"data/{name}", int(group[f"obs/{config.position}"].shape[0]), source))
    return demos, rejected


def _control_rate(data: Any, config: RobomimicConfig) -> float:
    """env_args' env_kwargs.control_freq; else pair.robomimic.control_hz; else the file is refused."""
    raw = data.attrs.get("env_args")
    rate = None
    if raw is not None:
        try:
            rate = (
                json.loads(raw.decode() if isinstance(raw, bytes) else raw)
                .get("env_kwargs", {})
                .get("control_freq")
            )
        except (ValueError, AttributeError):
            rate = None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
        return float(rate)
    if config.control_hz is not None:
        return float(config.control_hz)
    raise Hdf5Rejected(
        "no_control_rate",
        "data.attrs['env_args'] gives no env_kwargs.control_freq: set pair.robomimic.control_hz to the rate "
        "the demos were recorded at (robosuite's default is 20 Hz)",
    )


def read_demo_streams(
    path: Path, source: DemoSource, grippers: tuple[int, ...] = (0,), cameras: tuple[int, ...] = (0,)
) -> Streams:
    """One demo as the streams of a recording: every row stamped at its control step."""
    import h5py

    with h5py.File(path, "r") as f:
        group = f.get(source.key)
        if group is None:
            raise RecordingError("missing_topic", f"no {source.key} in {path.name}")
        obs = group["obs"]
        rows = int(obs[source.position].shape[0])
        ns = np.round(np.arange(rows) * (1e9 / source.control_hz)).astype(np.int64)
        streams: dict[int, GripperStreams] = {}
        for i in grippers:
            keys = [_robot_key(k, i) for k in (source.position, source.quaternion, source.gripper)]
            missing = [k for k in keys if k not in obs]
            if missing:
                raise RecordingError(
                    "missing_topic",
                    f"{source.key} has no obs/{', obs/'.join(missing)} for gripper {i} "
                    f"(convert.grippers {list(grippers)}; it has: {', '.join(sorted(obs))})",
                )
            position, quaternion, qpos = (np.asarray(obs[k][()], np.float64) for k in keys)
            _require_rows(source.key, keys, rows, position, quaternion, qpos)
            if (
                position.shape[1:] != (3,)
                or quaternion.shape[1:] != (4,)
                or qpos.ndim != 2
                or qpos.shape[1] < 2
            ):
                raise RecordingError(
                    "bad_message",
                    f"{source.key}: obs/{keys[0]} must be (N, 3), obs/{keys[1]} (N, 4) and obs/{keys[2]} "
                    f"(N, 2) finger joints; they are {position.shape}, {quaternion.shape}, {qpos.shape}",
                )
            streams[i] = GripperStreams(keys[0], keys[2], ns, position, quaternion, ns, finger_opening(qpos))
        found, missing_cameras, looked = {}, [], {}
        for k in cameras:
            name = source.cameras[k] if k < len(source.cameras) else None
            looked[k] = (
                f"obs/{name} of {source.key}" if name else f"pair.robomimic.cameras names no camera {k}"
            )
            if name is None or name not in obs:
                if k == 0:
                    raise RecordingError("missing_topic", f"{source.key} has no obs/{name} (camera 0)")
                missing_cameras.append(k)
                continue
            images = obs[name]
            if (
                images.dtype != np.uint8
                or images.ndim != 4
                or images.shape[-1] != 3
                or images.shape[0] != rows
            ):
                raise RecordingError(
                    "bad_message",
                    f"{source.key}: obs/{name} must be uint8 RGB rows (N, H, W, 3) with N = {rows}, "
                    f"it is {images.dtype} {images.shape}",
                )
            found[k] = CameraStream(name, ns, list(images[()]), "rgb")  # robomimic's frames are small
    return Streams(
        cameras=found,
        grippers=streams,
        truncated=None,
        missing_cameras=tuple(missing_cameras),
        camera_sources=looked,
    )


def finger_opening(qpos: np.ndarray) -> np.ndarray:
    """The gripper's opening from its two finger joints: left minus right (each from the centre)."""
    return qpos[:, 0] - qpos[:, 1]


def _require_rows(key: str, names: list[str], rows: int, *arrays: np.ndarray) -> None:
    for name, array in zip(names, arrays):
        if len(array) != rows:
            raise RecordingError(
                "bad_message", f"{key}: obs/{name} has {len(array)} rows, obs/{names[0]} {rows}: one per step"
            )
