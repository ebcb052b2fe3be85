"""One closed-loop episode: a controller (the policy's runner, or a reference) drives the simulated
gripper in a new scene, seeing only what a robot would.

The robot's streams run on their own clocks, drawn per episode as a sample recording's are
(`recording.random_timing`): camera frames at 30 Hz with about 1 ms of jitter and 1-3 % of them
dropped, poses at 120-200 Hz, openings at about 45 Hz. Each sample is taken from the simulated
trajectory at its own time (positions and openings linear between the simulator's steps, rotations
by slerp), and each frame is rendered there by the renderer that made the sample recordings (the
same camera model and image size). When the controller is asked, at the time of the last executed
target, it gets what had arrived: the latest `history_frames` frames that the pose and opening
streams already cover (the runner interpolates them at a frame's time and never extrapolates, as a
robot waits for them), with those streams' samples up to that time, as an `Observation`. It answers
with a chunk of absolute, timed targets; the simulator executes the steps marked to execute that
are not yet past, and the controller is asked again. The episode ends when the block is released or
at `time_limit_s`, and the simulator judges it (`Simulator.outcome`).

Scenes come from `plan_motion` with seeds of their own: SeedSequence([ROLLOUT_ENTROPY, seed]).
A sample export seeds recording i with SeedSequence([its seed, i]), so a rollout scene is a
recording of the dataset only if the export was made with `--seed` ROLLOUT_ENTROPY. The same seed and
controller give the same episode, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.runtime.observation import Observation
from policypipe.synthetic.motion import MotionPlan, plan_motion
from policypipe.synthetic.recording import StreamTiming, random_timing, sample_clock
from policypipe.synthetic.render import render_view_bgr, table_texture
from policypipe.synthetic.scene import Scene
from policypipe.synthetic.simulator import NS, SimConfig, SimState, Simulator, start_state

# First word of every rollout scene's seed: far above any sample export's seed.
ROLLOUT_ENTROPY = 0x5EED_2200_0000
START_NS = 1_900_000_000 * NS  # the scenes' clock starts here (any value: times are relative)
LEAD_IN_NS = NS // 2  # the streams run this long, the gripper still, before the episode starts
HISTORY_NS = NS // 2  # pose and opening samples sent with each request: the last half second


class Chunk(Protocol):
    time_ns: np.ndarray  # (H,)
    position: np.ndarray  # (H, 3)
    quaternion: np.ndarray  # (H, 4)
    width: np.ndarray  # (H,)
    execute: np.ndarray  # (H,) bool


class Controller(Protocol):
    def act(
        self, observation: Observation, now_ns: int | None = None, episode_start_ns: int | None = None
    ) -> Chunk: ...


@dataclass(frozen=True)
class RolloutConfig:
    time_limit_s: float = 14.0
    frequency_hz: float = 30.0  # the policy's step rate: the targets' spacing
    camera_size: tuple[int, int] = (320, 240)  # the sample recordings' (width, height)
    history_frames: int = 12  # frames sent with each request
    sim: SimConfig = field(default_factory=SimConfig)


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    outcome: str
    duration_s: float
    distance_to_mark_m: float
    final_frame: np.ndarray  # RGB, the camera's last view
    frames: list[np.ndarray]  # RGB, every frame the camera captured (kept only when asked)
    missed_closes: list[dict[str, float]] = field(default_factory=list)  # `Simulator.missed_closes`


def rollout_scene(seed: int) -> MotionPlan:
    """The scene of rollout `seed` (its demonstration plan gives the start pose and the references)."""
    return plan_motion(np.random.default_rng(np.random.SeedSequence([ROLLOUT_ENTROPY, seed])), START_NS)


def stream_clocks(seed: int, start_ns: int, stop_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The capture times of an episode's camera frames (the dropped ones left out), poses and openings,
    as a sample recording's (`random_timing`, `sample_clock`), from the episode's seed."""
    rng = np.random.default_rng(np.random.SeedSequence([ROLLOUT_ENTROPY, seed, 1]))
    timing: StreamTiming = random_timing(rng)
    camera = sample_clock(rng, start_ns, stop_ns, timing.camera_hz, timing.camera_jitter_s)
    camera = camera[rng.random(len(camera)) >= timing.camera_drop_fraction]
    pose = sample_clock(rng, start_ns, stop_ns, timing.pose_hz, timing.pose_jitter_s)
    width = sample_clock(rng, start_ns, stop_ns, timing.width_hz, timing.width_jitter_s)
    return camera, pose, width


class _Trajectory:
    """The simulated state after every step, and between steps as a robot's streams sample it."""

    def __init__(self, state: SimState) -> None:
        self.t: list[int] = []
        self.rows: list[np.ndarray] = []  # position (3), quaternion (4), width, block centre (3), yaw
        self.add(state)

    def add(self, s: SimState) -> None:
        row = np.concatenate([s.position, s.quaternion, [s.width], s.block_centre, [s.block_yaw]])
        if self.t and s.t_ns <= self.t[-1]:  # a target that takes effect no later: it replaces the last
            self.rows[-1] = row
        else:
            self.t.append(int(s.t_ns))
            self.rows.append(row)

    def at(self, times: np.ndarray) -> np.ndarray:
        """(N, 12) states at `times` (held before the first step and after the last): linear between
        steps, rotations by slerp, the block's yaw the short way round."""
        t, rows = np.asarray(self.t), np.stack(self.rows)
        i = np.clip(np.searchsorted(t, times, side="right"), 1, max(len(t) - 1, 1))
        if len(t) == 1:
            return np.repeat(rows, len(times), axis=0)
        u = np.clip((times - t[i - 1]) / (t[i] - t[i - 1]), 0.0, 1.0)[:, None]
        a, b = rows[i - 1], rows[i]
        out = a + u * (b - a)
        r0 = Rotation.from_quat(a[:, 3:7])
        out[:, 3:7] = (
            r0 * Rotation.from_rotvec(u * (r0.inv() * Rotation.from_quat(b[:, 3:7])).as_rotvec())
        ).as_quat()
        out[:, 11] = a[:, 11] + u[:, 0] * ((b[:, 11] - a[:, 11] + np.pi) % (2 * np.pi) - np.pi)
        return out

    def state_at(self, t_ns: int) -> SimState:
        (row,) = self.at(np.array([t_ns]))
        return SimState(t_ns, row[:3], row[3:7], float(row[7]), row[8:11], float(row[11]))


def run_episode(
    controller: Controller, seed: int, config: RolloutConfig, keep_frames: bool = False
) -> EpisodeResult:
    plan = rollout_scene(seed)
    scene, texture = plan.scene, table_texture(plan.scene)
    t0 = plan.start_ns
    end_ns = t0 + int(round(config.time_limit_s * NS))
    position, quaternion = plan.pose_at(np.array([t0]))
    width = float(plan.width_at(np.array([t0]))[0])
    sim = Simulator(scene, start_state(scene, t0, position[0], quaternion[0], width), config.sim)
    trajectory = _Trajectory(sim.state)
    # The streams run from before the start to past the time limit; a chunk may overshoot it by a step.
    camera_ns, pose_ns, width_ns = stream_clocks(seed, t0 - LEAD_IN_NS, end_ns + NS)
    rendered: dict[int, np.ndarray] = {}  # capture time -> RGB, each frame rendered once

    def frame(t_ns: int) -> np.ndarray:
        if t_ns not in rendered:
            rendered[t_ns] = camera_view(scene, texture, trajectory.state_at(t_ns), config.camera_size)
        return rendered[t_ns]

    def observe(now: int) -> Observation:
        """What has arrived by `now`: the frames the pose and opening streams cover, and those streams."""
        poses = pose_ns[(pose_ns <= now) & (pose_ns > now - HISTORY_NS)]
        widths = width_ns[(width_ns <= now) & (width_ns > now - HISTORY_NS)]
        frames = camera_ns[camera_ns <= min(poses[-1], widths[-1])][-config.history_frames :]
        states = trajectory.at(poses)
        return Observation.checked(
            frames,
            np.stack([frame(int(t)) for t in frames]),
            poses,
            states[:, :3],
            states[:, 3:7],
            widths,
            trajectory.at(widths)[:, 7],
        )

    # The episode starts with the streams' first frame: they ran LEAD_IN_NS with the gripper still
    # before t0, as a recording's first frames see it still.
    first_ns = int(camera_ns[0])
    now = t0
    while now < end_ns and not sim.done():
        chunk = controller.act(observe(now), now_ns=now, episode_start_ns=first_ns)
        steps = np.flatnonzero(chunk.execute & (chunk.time_ns > now))
        if len(steps) == 0:
            raise ValueError(
                f"the controller's chunk at t = {now} ns executes no step: it would wait forever"
            )
        for k in steps:
            now = int(chunk.time_ns[k])
            trajectory.add(sim.step(now, chunk.position[k], chunk.quaternion[k], float(chunk.width[k])))
            if sim.done() or now >= end_ns:
                break
    frames = [frame(int(t)) for t in camera_ns[(camera_ns >= t0) & (camera_ns <= now)]] if keep_frames else []
    final = frame(int(camera_ns[camera_ns <= now][-1]))
    return EpisodeResult(
        seed, sim.outcome(), (now - t0) / NS, sim.distance_to_mark(), final, frames, sim.missed_closes
    )


def camera_view(scene: Scene, texture: np.ndarray, state: SimState, size: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) uint8 RGB: what the wrist camera sees of the simulated state."""
    bgr = render_view_bgr(
        scene,
        texture,
        state.position,
        state.quaternion,
        state.block_centre,
        state.block_yaw,
        state.width,
        size,
    )
    return np.ascontiguousarray(bgr[..., ::-1])


def observation_of(history: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, float]]) -> Observation:
    """The runner's observation from (capture time, RGB frame, position, quaternion, width) samples,
    oldest first: every stream sampled at the frames' times, as a robot with one clock sends them."""
    times = [h[0] for h in history]
    return Observation.checked(
        times,
        np.stack([h[1] for h in history]),
        times,
        np.stack([h[2] for h in history]),
        np.stack([h[3] for h in history]),
        times,
        [h[4] for h in history],
    )
