"""What a robot has when it asks the policy for actions, checked before anything is computed.

All times are integer nanoseconds on one clock (the clock the recordings were captured on, or the
robot's, as long as every stream uses it); poses are the gripper's in the world frame.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# A quaternion further than this from unit norm is a bug upstream, not rounding (convert's default).
QUATERNION_NORM_TOLERANCE = 1e-3


class ObservationError(ValueError):
    """An observation the runner cannot act on; the message says what is wrong and what to send."""


# A field of camera k >= 1 or gripper i >= 1: recording format 2's names (`camera{k}`, `robot{i}`).
OTHER_FIELD = re.compile(
    r"^(?:camera([0-9]+)_(frame_ns|frames)|robot([0-9]+)_(pose_ns|position|quaternion|width_ns|width|holding))$"
)
CAMERA_FIELDS = ("frame_ns", "frames")
GRIPPER_FIELDS = ("pose_ns", "position", "quaternion", "width_ns", "width")
# Sent where the gripper reports it; the runner's deadband then holds only a held object.
OPTIONAL_GRIPPER_FIELDS = ("holding",)


def number_zero(collection: str, field: str) -> property:
    """A read-only alias of `self.<collection>[0].<field>`: camera 0's or gripper 0's field by the
    name recording format 1 gave it (its only camera and gripper)."""
    return property(lambda self: getattr(getattr(self, collection)[0], field), doc=f"{collection}[0].{field}")


@dataclass(frozen=True)
class CameraFrames:
    frame_ns: np.ndarray  # (F,) int64 capture times of the camera's latest frames, increasing
    frames: np.ndarray  # (F, H, W, 3) uint8 RGB, the camera's own resolution


@dataclass(frozen=True)
class GripperState:
    pose_ns: np.ndarray  # (P,) int64 times of the gripper's recent poses, increasing
    position: np.ndarray  # (P, 3) metres, world frame
    quaternion: np.ndarray  # (P, 4) x, y, z, w, world <- gripper
    width_ns: np.ndarray  # (W,) int64 times of its recent openings, increasing
    width: np.ndarray  # (W,) metres
    # (W,) bool: whether the gripper reported its fingers closed on an object at each opening (a
    # gripper's object detection: Robotiq's gOBJ, a Franka Hand's grasp state); None: it does not say.
    holding: np.ndarray | None = None

    def holding_at(self, t: int) -> bool | None:
        """The gripper's report at its latest opening at or before t (its first, if none is)."""
        if self.holding is None:
            return None
        return bool(self.holding[max(int(np.searchsorted(self.width_ns, t, side="right")) - 1, 0)])


@dataclass(frozen=True)
class Observation:
    """Every camera's latest frames and every gripper's recent samples, by their numbers (recording
    format 2). Camera 0 and gripper 0 are always there: camera 0's latest frame is the time t the
    policy acts at, and their fields keep recording format 1's names (`frame_ns`, `pose_ns`, ...)."""

    cameras: dict[int, CameraFrames]
    grippers: dict[int, GripperState]
    # (F, S) the synthetic scene's state at each of camera 0's frames, for the privileged control
    # alone (`synthetic.privileged`): the rollout's simulator sets it; a robot has none to send.
    scene_state: np.ndarray | None = None

    # Recording format 1's names: camera 0's and gripper 0's fields.
    frame_ns = number_zero("cameras", "frame_ns")
    frames = number_zero("cameras", "frames")
    pose_ns = number_zero("grippers", "pose_ns")
    position = number_zero("grippers", "position")
    quaternion = number_zero("grippers", "quaternion")
    width_ns = number_zero("grippers", "width_ns")
    width = number_zero("grippers", "width")
    holding = number_zero("grippers", "holding")

    @classmethod
    def checked(
        cls,
        frame_ns,
        frames,
        pose_ns,
        position,
        quaternion,
        width_ns,
        width,
        holding=None,
        **others,
    ) -> Observation:
        """The observation with its arrays as the runner uses them, or ObservationError.

        Camera 0 and gripper 0 by their own names; camera k >= 1 as `camera{k}_frame_ns` and
        `camera{k}_frames`, gripper i >= 1 as `robot{i}_pose_ns`, `robot{i}_position`, ... (the
        names of `fields`); `holding` and `robot{i}_holding` where the gripper reports it."""
        cameras = {0: {"frame_ns": frame_ns, "frames": frames}}
        grippers = {0: dict(zip(GRIPPER_FIELDS, (pose_ns, position, quaternion, width_ns, width)))}
        if holding is not None:
            grippers[0]["holding"] = holding
        for name, value in others.items():
            match = OTHER_FIELD.match(name)
            if match is None or (match[1] or match[3]).startswith("0"):  # camera 0: `frames`; no 01
                raise ObservationError(
                    f"unknown observation field {name[:60]!r}: camera 0 and gripper 0 are "
                    f"{', '.join(CAMERA_FIELDS + GRIPPER_FIELDS)}; camera k >= 1 is camera{{k}}_frame_ns and "
                    "camera{k}_frames, gripper i >= 1 robot{i}_pose_ns, robot{i}_position, "
                    "robot{i}_quaternion, robot{i}_width_ns and robot{i}_width (and holding, "
                    "robot{i}_holding where the gripper reports a held object)"
                )
            if match[1]:
                cameras.setdefault(int(match[1]), {})[match[2]] = value
            else:
                grippers.setdefault(int(match[3]), {})[match[4]] = value
        for k, parts in cameras.items():
            if missing := [f"camera{k}_{f}" for f in CAMERA_FIELDS if f not in parts]:
                raise ObservationError(f"camera {k} lacks {', '.join(missing)}: send both its fields")
        for i, parts in grippers.items():
            if missing := [f"robot{i}_{f}" for f in GRIPPER_FIELDS if f not in parts]:
                raise ObservationError(f"gripper {i} lacks {', '.join(missing)}: send all five of its fields")
        return cls(
            cameras={k: checked_camera(k, **cameras[k]) for k in sorted(cameras)},
            grippers={i: _gripper(i, **grippers[i]) for i in sorted(grippers)},
        )

    def fields(self) -> dict[str, np.ndarray]:
        """The arrays by the names `checked` takes (and the server's protocol sends)."""
        out: dict[str, np.ndarray] = {}
        for k, camera in self.cameras.items():
            out |= {_field_name("camera", k, f): getattr(camera, f) for f in CAMERA_FIELDS}
        for i, gripper in self.grippers.items():
            out |= {_field_name("robot", i, f): getattr(gripper, f) for f in GRIPPER_FIELDS}
            if gripper.holding is not None:
                out[_field_name("robot", i, "holding")] = gripper.holding
        return out


def is_field_name(name: str) -> bool:
    """Whether `name` is an observation field of some camera or gripper."""
    return (
        name in CAMERA_FIELDS
        or name in GRIPPER_FIELDS
        or name in OPTIONAL_GRIPPER_FIELDS
        or OTHER_FIELD.match(name) is not None
    )


def field_names(grippers: list[int], cameras: list[int]) -> list[str]:
    """The fields of an observation of these cameras and grippers, camera 0's and gripper 0's first."""
    return [_field_name("camera", k, f) for k in cameras for f in CAMERA_FIELDS] + [
        _field_name("robot", i, f) for i in grippers for f in GRIPPER_FIELDS
    ]


def _field_name(prefix: str, number: int, field: str) -> str:
    return field if number == 0 else f"{prefix}{number}_{field}"


def checked_camera(k: int, frame_ns, frames) -> CameraFrames:
    frame_ns = checked_times(frame_ns, _field_name("camera", k, "frame_ns"))
    name = _field_name("camera", k, "frames")
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise ObservationError(f"{name} must be uint8 RGB, got {frames.dtype}")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        hint = " (channels first? send (F, H, W, 3))" if frames.ndim == 4 and frames.shape[1] == 3 else ""
        raise ObservationError(f"{name} must be (F, height, width, 3) RGB, got shape {frames.shape}{hint}")
    if len(frames) != len(frame_ns):
        raise ObservationError(
            f"{len(frames)} {name} but {len(frame_ns)} {_field_name('camera', k, 'frame_ns')}"
        )
    if min(frames.shape[1:3]) < 8:
        raise ObservationError(
            f"{name} of {frames.shape[2]}x{frames.shape[1]} pixels: too small for a camera"
        )
    return CameraFrames(frame_ns, np.ascontiguousarray(frames))


def _gripper(i: int, pose_ns, position, quaternion, width_ns, width, holding=None) -> GripperState:
    def name(field: str) -> str:
        return _field_name("robot", i, field)

    pose_ns = checked_times(pose_ns, name("pose_ns"))
    position = checked_floats(position, name("position"), (len(pose_ns), 3))
    quaternion = checked_floats(quaternion, name("quaternion"), (len(pose_ns), 4))
    norm = np.linalg.norm(quaternion, axis=1)
    if (off := np.abs(norm - 1) > QUATERNION_NORM_TOLERANCE).any():
        j = int(np.flatnonzero(off)[0])
        raise ObservationError(
            f"{name('quaternion')} {j} has norm {norm[j]:.6f}, not 1 (x, y, z, w, scalar last; "
            f"{int(off.sum())} of {len(norm)} off by more than {QUATERNION_NORM_TOLERANCE})"
        )
    width_ns = checked_times(width_ns, name("width_ns"))
    width = checked_floats(width, name("width"), (len(width_ns),))
    if holding is not None:
        holding = np.asarray(holding)
        if holding.dtype != np.bool_ or holding.shape != width_ns.shape:
            raise ObservationError(
                f"{name('holding')} must be ({len(width_ns)},) bool, the gripper's object detection at each "
                f"of its {name('width_ns')}, got {holding.dtype} of shape {holding.shape}"
            )
    return GripperState(pose_ns, position, quaternion, width_ns, width, holding)


def checked_times(values, name: str) -> np.ndarray:
    times = np.asarray(values)
    if times.ndim != 1 or len(times) == 0:
        raise ObservationError(
            f"{name} must be a non-empty 1-D array of int64 nanoseconds, got shape {times.shape}"
        )
    if not np.issubdtype(times.dtype, np.integer):
        raise ObservationError(f"{name} must be integer nanoseconds, got {times.dtype} (seconds as floats?)")
    if times.dtype.kind == "u" and times.max() > np.iinfo(np.int64).max:
        raise ObservationError(f"{name} holds {int(times.max())} ns, beyond int64: not a capture time")
    times = times.astype(np.int64)
    # Compared, not subtracted: a difference of int64 times wraps when they are 2^63 apart.
    if (back := times[1:] <= times[:-1]).any():
        i = int(np.flatnonzero(back)[0])
        raise ObservationError(
            f"{name} must increase: sample {i + 1} ({times[i + 1]}) is not after sample {i} ({times[i]}), "
            "times going backwards or repeated"
        )
    return times


def checked_floats(values, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != shape:
        raise ObservationError(f"{name} must have shape {shape}, got {array.shape}")
    if not np.isfinite(array).all():
        raise ObservationError(
            f"{name} holds NaN or infinity at {np.argwhere(~np.isfinite(array))[0].tolist()}"
        )
    return array
