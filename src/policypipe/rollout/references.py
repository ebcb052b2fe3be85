"""The references a rollout stands beside, on the same scenes: what the scene's demonstrator does
(the simulator's check), a blind replay of the nearest training demonstration (what memorising
the data without seeing gets), and holding still (the floor). Each answers with timed absolute
targets from the latest frame's time, as the runner does; the harness skips those already past."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from policypipe.dataset import layout
from policypipe.runtime.chunk import GripperTargets
from policypipe.runtime.observation import Observation
from policypipe.synthetic.motion import MotionPlan
from policypipe.synthetic.simulator import NS

# Choosing the nearest demonstration by its start pose: a radian of heading counts as 10 cm.
HEADING_M_PER_RAD = 0.1


@dataclass(frozen=True)
class TargetChunk:
    """Timed absolute targets, every one executed: what the references send."""

    time_ns: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    width: np.ndarray
    execute: np.ndarray

    @property
    def grippers(self) -> dict[int, GripperTargets]:
        """The targets as a runner's chunk holds them: one gripper's (a rig joins them: `rig.PerGripper`)."""
        return {0: GripperTargets(self.position, self.quaternion, self.width)}


class _Reference:
    def __init__(self, frequency_hz: float, steps: int = 8) -> None:
        self.period, self.steps = int(round(NS / frequency_hz)), steps

    def times(self, observation: Observation) -> np.ndarray:
        return int(observation.frame_ns[-1]) + self.period * np.arange(1, self.steps + 1, dtype=np.int64)

    def chunk(self, times, position, quaternion, width) -> TargetChunk:
        return TargetChunk(times, position, quaternion, width, np.ones(len(times), bool))


class DemonstrationReplay(_Reference):
    """The scene's own demonstration, replayed open loop (what the generator's demonstrator does in
    this scene, blind to what happens)."""

    def __init__(self, plan: MotionPlan, frequency_hz: float, steps: int = 8) -> None:
        super().__init__(frequency_hz, steps)
        self.plan = plan

    def act(
        self, observation: Observation, now_ns: int | None = None, episode_start_ns: int | None = None
    ) -> TargetChunk:
        times = self.times(observation)
        return self.chunk(times, *self.plan.pose_at(times), self.plan.width_at(times))


class HoldStill(_Reference):
    """The gripper kept where it is, open as it is."""

    def act(
        self, observation: Observation, now_ns: int | None = None, episode_start_ns: int | None = None
    ) -> TargetChunk:
        times = self.times(observation)
        repeat = lambda a: np.repeat(np.asarray(a)[None], self.steps, axis=0)  # noqa: E731
        return self.chunk(
            times,
            repeat(observation.position[-1]),
            repeat(observation.quaternion[-1]),
            np.full(self.steps, float(observation.width[-1])),
        )


@dataclass(frozen=True)
class Demonstration:
    """A training episode's path at its frames: seconds from its first frame, the TCP's positions and
    orientations (world frame), the openings."""

    stem: str
    t_s: np.ndarray  # (N,)
    position: np.ndarray  # (N, 3)
    quaternion: np.ndarray  # (N, 4) xyzw
    width: np.ndarray  # (N,)

    def heading(self) -> float:
        return _heading(self.quaternion[0])


def _heading(quaternion: np.ndarray) -> float:
    """The direction of the tool's x axis on the table, rad."""
    x_axis = Rotation.from_quat(quaternion).as_matrix()[:, 0]
    return float(np.arctan2(x_axis[1], x_axis[0]))


def not_of_the_sample_scene(store: Path) -> str | None:
    """Why a dataset's policy cannot be rolled out in the sample's simulator, or None: a dataset
    imported from HDF5 (robomimic's or ALOHA's robots, cameras and tasks) is not of the sample scene."""
    import zarr

    episodes = zarr.open_group(store, mode="r").attrs[layout.ATTRS_EPISODES]
    imported = sorted({ep["source"]["format"] for ep in episodes if "source" in ep})
    if not imported:
        return None
    return (
        f"{store} was imported from {' and '.join(imported)} HDF5 files: the closed loop runs in the "
        "synthetic sample's scene only, so its policy is evaluated offline (metrics/eval.json)"
    )


def training_demonstrations(store: Path, stats: dict, gripper: int = 0) -> list[Demonstration]:
    """The training side's episodes of the dataset (`stats`' split), as gripper `gripper`'s paths."""
    import zarr

    root = zarr.open_group(store, mode="r")
    ends = np.asarray(root[layout.EPISODE_ENDS][:])
    starts = np.concatenate([[0], ends[:-1]])
    time, position, rotvec, width = (
        np.asarray(root[key][:])
        for key in (
            layout.TIMESTAMP,
            layout.eef_pos(gripper),
            layout.eef_rot(gripper),
            layout.gripper_width(gripper),
        )
    )
    stems = [episode["stem"] for episode in root.attrs[layout.ATTRS_EPISODES]]
    demonstrations = []
    for e in stats["split"]["train"]:
        rows = slice(int(starts[e]), int(ends[e]))
        demonstrations.append(
            Demonstration(
                stems[e],
                time[rows] - time[rows][0],
                position[rows].astype(np.float64),
                Rotation.from_rotvec(rotvec[rows]).as_quat(),
                width[rows].astype(np.float64).reshape(-1),  # stored (N, 1)
            )
        )
    return demonstrations


def nearest_demonstration(
    demonstrations: list[Demonstration], position: np.ndarray, quaternion: np.ndarray
) -> Demonstration:
    """The demonstration that starts nearest the pose (position, and heading at HEADING_M_PER_RAD)."""
    heading = _heading(quaternion)

    def distance(d: Demonstration) -> float:
        turn = abs((d.heading() - heading + np.pi) % (2 * np.pi) - np.pi)
        return float(np.linalg.norm(d.position[0] - position)) + HEADING_M_PER_RAD * turn

    return min(demonstrations, key=distance)


class NearestDemonstrationReplay(_Reference):
    """A blind reference: the training demonstration that started nearest this episode's start pose,
    its motion replayed open loop from this start (moved, and turned by the difference in heading, so
    that it starts here). It sees nothing: what it gets right, it gets from the scenes' likeness."""

    def __init__(
        self,
        demonstration: Demonstration,
        start_ns: int,
        start_position: np.ndarray,
        start_quaternion: np.ndarray,
        frequency_hz: float,
        steps: int = 8,
    ) -> None:
        super().__init__(frequency_hz, steps)
        d = demonstration
        self.demonstration, self.start_ns = d, int(start_ns)
        # The path is turned about the vertical by the difference in heading (a descent stays a
        # descent whatever the hands' tilts), the orientations by the whole difference (so the first
        # target is the start orientation, not a jump).
        turn = Rotation.from_euler("z", _heading(start_quaternion) - d.heading())
        move = Rotation.from_quat(start_quaternion) * Rotation.from_quat(d.quaternion[0]).inv()
        self.position = np.asarray(start_position) + turn.apply(d.position - d.position[0])
        self.rotation = Slerp(d.t_s, move * Rotation.from_quat(d.quaternion))

    def act(
        self, observation: Observation, now_ns: int | None = None, episode_start_ns: int | None = None
    ) -> TargetChunk:
        times = self.times(observation)
        d = self.demonstration
        s = np.clip((times - self.start_ns) / NS, d.t_s[0], d.t_s[-1])  # held after its end
        position = np.stack([np.interp(s, d.t_s, self.position[:, k]) for k in range(3)], axis=1)
        return self.chunk(times, position, self.rotation(s).as_quat(), np.interp(s, d.t_s, d.width))
