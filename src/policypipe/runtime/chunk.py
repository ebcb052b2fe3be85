"""What the runner returns: a chunk of absolute targets for every gripper, each with its time.

NumPy only: the robot side (`serving.protocol`, the client) holds chunks without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policypipe.runtime.observation import number_zero

# A target's parts, as the protocol names them (gripper i >= 1 prefixed robot{i}_).
TARGET_FIELDS = ("position", "quaternion", "width")


@dataclass(frozen=True)
class GripperTargets:
    """One gripper's targets, one per step of the chunk."""

    position: np.ndarray  # (H, 3) metres, world frame
    quaternion: np.ndarray  # (H, 4) x, y, z, w, world <- gripper
    width: np.ndarray  # (H,) metres, within the training episodes' openings


@dataclass(frozen=True)
class ActionChunk:
    """A chunk of absolute targets, each with the time it is meant for."""

    observation_ns: int  # t: the capture time of the latest frame the chunk was computed from
    time_ns: np.ndarray  # (H,) int64 t + (k + 1) / f
    grippers: dict[int, GripperTargets]  # every gripper the policy drives, by number
    # Which steps to execute: the first n_action_steps, less those already past at `now_ns`.
    execute: np.ndarray  # (H,) bool
    past: np.ndarray  # (H,) bool: time_ns <= now_ns (all False without a now_ns)
    relative: np.ndarray  # (H, 10 G) the policy's output per gripper: relative pose (9), width change (1)
    # The runtime monitor's reading of the chunk (`monitor.scores.MonitorReading`), where the policy
    # has a calibration: novelty, inconsistency, score, alarm.
    monitor: Any = None

    # Gripper 0's targets, by recording format 1's names (its only gripper).
    position = number_zero("grippers", "position")
    quaternion = number_zero("grippers", "quaternion")
    width = number_zero("grippers", "width")

    def fields(self) -> dict[str, object]:
        """The chunk by the protocol's names: gripper 0's targets as `position`, `quaternion`,
        `width`, gripper i's as `robot{i}_position`, ..."""
        out: dict[str, object] = {"observation_ns": int(self.observation_ns), "time_ns": self.time_ns}
        out |= {f: getattr(self.grippers[0], f) for f in TARGET_FIELDS}
        out |= {"execute": self.execute, "past": self.past, "relative": self.relative}
        if self.monitor is not None:
            out["monitor"] = self.monitor.fields()
        for i, targets in self.grippers.items():
            if i != 0:
                out |= {target_field(i, f): getattr(targets, f) for f in TARGET_FIELDS}
        return out


def opens_within_deadband(opening_m: np.ndarray | float, deadband_m: float) -> np.ndarray | bool:
    """Whether a change of opening opens the fingers by less than the deadband: the steps the
    gripper's deadband holds (docs/runtime.md, "The gripper's deadband"). A chunk's small width
    error would otherwise let a held block go; a real opening, the release, is wider."""
    return (opening_m > 0.0) & (opening_m < deadband_m)


def held_by_deadband(opening: np.ndarray, deadband_m: float, holding: bool | None) -> np.ndarray:
    """(H,) the steps of a chunk, each an opening `dw` from the reading at its observation, that the
    runner's deadband turns into none. It keeps a held block held; a gripper that reports holding
    nothing (a close that missed) opens freely, so that it can try again, and one that reports
    nothing is held."""
    return opens_within_deadband(opening, deadband_m) & (holding is not False)


def width_to_send(target_m: float, reading_m: float, holding: bool | None, deadband_m: float) -> float:
    """The opening a robot-side loop sends a gripper at an executed step: the chunk's target, or,
    while the gripper reports holding an object, its reading now where the target would open the
    fingers by less than `deadband_m` (the exported policy's `open_deadband_m`).

    The runner applies its deadband when it composes a chunk, against the opening at the chunk's
    observation (`held_by_deadband`). A chunk asked for while the fingers were still open
    composes its closing widths on the open reading, so that none of its steps opens anything by
    that rule; if its close ends at about the block's width, a step below it grips the block and
    the next, a hair above it, lets it go where it lay. Applied at each step against the reading
    then, the rule holds that grip too (docs/runtime.md, "The gripper's deadband"). Only on a
    report of holding: a gripper that reports nothing keeps the runner's rule alone."""
    if holding is True and opens_within_deadband(target_m - reading_m, deadband_m):
        return reading_m
    return target_m


def target_field(gripper: int, field: str) -> str:
    return field if gripper == 0 else f"robot{gripper}_{field}"
