"""What a robot has when it asks the policy for actions, checked before anything is computed.

All times are integer nanoseconds on one clock (the clock the recordings were captured on, or the
robot's, as long as every stream uses it); poses are the gripper's in the world frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A quaternion further than this from unit norm is a bug upstream, not rounding (convert's default).
QUATERNION_NORM_TOLERANCE = 1e-3


class ObservationError(ValueError):
    """An observation the runner cannot act on; the message says what is wrong and what to send."""


@dataclass(frozen=True)
class Observation:
    frame_ns: np.ndarray  # (F,) int64 capture times of the latest camera frames, increasing
    frames: np.ndarray  # (F, H, W, 3) uint8 RGB, the camera's own resolution
    pose_ns: np.ndarray  # (P,) int64 times of the recent gripper poses, increasing
    position: np.ndarray  # (P, 3) metres, world frame
    quaternion: np.ndarray  # (P, 4) x, y, z, w, world <- gripper
    width_ns: np.ndarray  # (W,) int64 times of the recent gripper openings, increasing
    width: np.ndarray  # (W,) metres

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
    ) -> Observation:
        """The observation with its arrays as the runner uses them, or ObservationError."""
        frame_ns = _times(frame_ns, "frame_ns")
        frames = np.asarray(frames)
        if frames.dtype != np.uint8:
            raise ObservationError(f"frames must be uint8 RGB, got {frames.dtype}")
        if frames.ndim != 4 or frames.shape[-1] != 3:
            hint = " (channels first? send (F, H, W, 3))" if frames.ndim == 4 and frames.shape[1] == 3 else ""
            raise ObservationError(
                f"frames must be (F, height, width, 3) RGB, got shape {frames.shape}{hint}"
            )
        if len(frames) != len(frame_ns):
            raise ObservationError(f"{len(frames)} frames but {len(frame_ns)} frame_ns")
        if min(frames.shape[1:3]) < 8:
            raise ObservationError(
                f"frames of {frames.shape[2]}x{frames.shape[1]} pixels: too small for a camera"
            )
        pose_ns = _times(pose_ns, "pose_ns")
        position = _floats(position, "position", (len(pose_ns), 3))
        quaternion = _floats(quaternion, "quaternion", (len(pose_ns), 4))
        norm = np.linalg.norm(quaternion, axis=1)
        if (off := np.abs(norm - 1) > QUATERNION_NORM_TOLERANCE).any():
            i = int(np.flatnonzero(off)[0])
            raise ObservationError(
                f"quaternion {i} has norm {norm[i]:.6f}, not 1 (x, y, z, w, scalar last; "
                f"{int(off.sum())} of {len(norm)} off by more than {QUATERNION_NORM_TOLERANCE})"
            )
        width_ns = _times(width_ns, "width_ns")
        width = _floats(width, "width", (len(width_ns),))
        return cls(frame_ns, np.ascontiguousarray(frames), pose_ns, position, quaternion, width_ns, width)


def _times(values, name: str) -> np.ndarray:
    times = np.asarray(values)
    if times.ndim != 1 or len(times) == 0:
        raise ObservationError(
            f"{name} must be a non-empty 1-D array of int64 nanoseconds, got shape {times.shape}"
        )
    if not np.issubdtype(times.dtype, np.integer):
        raise ObservationError(f"{name} must be integer nanoseconds, got {times.dtype} (seconds as floats?)")
    times = times.astype(np.int64)
    if (back := np.diff(times) <= 0).any():
        i = int(np.flatnonzero(back)[0])
        raise ObservationError(
            f"{name} must increase: sample {i + 1} ({times[i + 1]}) is not after sample {i} ({times[i]}), "
            "times going backwards or repeated"
        )
    return times


def _floats(values, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != shape:
        raise ObservationError(f"{name} must have shape {shape}, got {array.shape}")
    if not np.isfinite(array).all():
        raise ObservationError(
            f"{name} holds NaN or infinity at {np.argwhere(~np.isfinite(array))[0].tolist()}"
        )
    return array
