"""One closed-loop episode: a controller (the policy's runner, or a reference) drives the simulated
gripper in a new scene, seeing only what a robot would.

Each step the simulator's state is rendered by the renderer that made the sample recordings (the
same camera model and image size), and the controller gets the latest `history_frames` frames with
the gripper's poses and openings at their capture times, as an `Observation`. It answers with a
chunk of absolute, timed targets; the simulator executes the steps marked to execute, one camera
period apart, rendering after each, and the controller is asked again. The episode ends when the
block is released or at `time_limit_s`, and the simulator judges it (`Simulator.outcome`).

Scenes come from `plan_motion` with seeds of their own: SeedSequence([ROLLOUT_ENTROPY, seed]).
A sample export seeds recording i with SeedSequence([its seed, i]), so a rollout scene is a
recording of the dataset only if the export was made with `--seed` ROLLOUT_ENTROPY. The same seed and
controller give the same episode, byte for byte.

Not yet: the recordings' timing (camera jitter and drops, pose and width at their own rates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from policypipe.runtime.observation import Observation
from policypipe.synthetic.motion import MotionPlan, plan_motion
from policypipe.synthetic.render import render_view_bgr, table_texture
from policypipe.synthetic.scene import Scene
from policypipe.synthetic.simulator import NS, SimConfig, SimState, Simulator, start_state

# First word of every rollout scene's seed: far above any sample export's seed.
ROLLOUT_ENTROPY = 0x5EED_2200_0000
START_NS = 1_900_000_000 * NS  # the scenes' clock starts here (any value: times are relative)


class Chunk(Protocol):
    time_ns: np.ndarray  # (H,)
    position: np.ndarray  # (H, 3)
    quaternion: np.ndarray  # (H, 4)
    width: np.ndarray  # (H,)
    execute: np.ndarray  # (H,) bool


class Controller(Protocol):
    def act(self, observation: Observation, episode_start_ns: int | None = None) -> Chunk: ...


@dataclass(frozen=True)
class RolloutConfig:
    time_limit_s: float = 14.0
    frequency_hz: float = 30.0  # the camera's rate, and the targets' spacing
    camera_size: tuple[int, int] = (320, 240)  # the sample recordings' (width, height)
    history_frames: int = 12  # frames (and poses, openings) sent with each request
    sim: SimConfig = field(default_factory=SimConfig)


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    outcome: str
    duration_s: float
    distance_to_mark_m: float
    final_frame: np.ndarray  # RGB, the camera's last view
    frames: list[np.ndarray]  # RGB, one a camera period (kept only when asked)
    missed_closes: list[dict[str, float]] = field(default_factory=list)  # `Simulator.missed_closes`


def rollout_scene(seed: int) -> MotionPlan:
    """The scene of rollout `seed` (its demonstration plan gives the start pose and the references)."""
    return plan_motion(np.random.default_rng(np.random.SeedSequence([ROLLOUT_ENTROPY, seed])), START_NS)


def run_episode(
    controller: Controller, seed: int, config: RolloutConfig, keep_frames: bool = False
) -> EpisodeResult:
    plan = rollout_scene(seed)
    scene, texture = plan.scene, table_texture(plan.scene)
    period = int(round(NS / config.frequency_hz))
    t0 = plan.start_ns
    position, quaternion = plan.pose_at(np.array([t0]))
    width = float(plan.width_at(np.array([t0]))[0])
    sim = Simulator(scene, start_state(scene, t0, position[0], quaternion[0], width), config.sim)
    history: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, float]] = []
    frames: list[np.ndarray] = []

    def observe(t_ns: int) -> None:
        s = sim.state
        rgb = camera_view(scene, texture, s, config.camera_size)
        history.append((t_ns, rgb, s.position.copy(), s.quaternion.copy(), s.width))
        del history[: -config.history_frames]
        if keep_frames:
            frames.append(rgb)

    # The gripper held still for a moment before the episode, as a recording starts.
    first_ns = t0 - 2 * period
    for t in (first_ns, t0 - period, t0):
        observe(t)
    t = t0
    end_ns = t0 + int(round(config.time_limit_s * NS))
    while t < end_ns and not sim.done():
        chunk = controller.act(observation_of(history), episode_start_ns=first_ns)
        steps = np.flatnonzero(chunk.execute)
        if len(steps) == 0:
            raise ValueError(f"the controller's chunk at t = {t} ns executes no step: it would wait forever")
        for k in steps:
            t = int(chunk.time_ns[k])
            sim.step(t, chunk.position[k], chunk.quaternion[k], float(chunk.width[k]))
            observe(t)
            if sim.done() or t >= end_ns:
                break
    return EpisodeResult(
        seed, sim.outcome(), (t - t0) / NS, sim.distance_to_mark(), history[-1][1], frames, sim.missed_closes
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


@dataclass(frozen=True)
class TargetChunk:
    """Timed absolute targets, every one executed: what the references send."""

    time_ns: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    width: np.ndarray
    execute: np.ndarray


class DemonstrationReplay:
    """A reference: the scene's own demonstration, replayed open loop at the camera's rate (what the
    generator's demonstrator does in this scene, blind to what happens)."""

    def __init__(self, plan: MotionPlan, frequency_hz: float, steps: int = 8) -> None:
        self.plan, self.period, self.steps = plan, int(round(NS / frequency_hz)), steps

    def act(self, observation: Observation, episode_start_ns: int | None = None) -> Chunk:
        t = int(observation.frame_ns[-1])
        times = t + self.period * np.arange(1, self.steps + 1, dtype=np.int64)
        position, quaternion = self.plan.pose_at(times)
        return TargetChunk(times, position, quaternion, self.plan.width_at(times), np.ones(self.steps, bool))


class HoldStill:
    """A reference: the gripper kept where it is, open as it is."""

    def __init__(self, frequency_hz: float, steps: int = 8) -> None:
        self.period, self.steps = int(round(NS / frequency_hz)), steps

    def act(self, observation: Observation, episode_start_ns: int | None = None) -> Chunk:
        t = int(observation.frame_ns[-1])
        times = t + self.period * np.arange(1, self.steps + 1, dtype=np.int64)
        repeat = lambda a: np.repeat(np.asarray(a)[None], self.steps, axis=0)  # noqa: E731
        return TargetChunk(
            times,
            repeat(observation.position[-1]),
            repeat(observation.quaternion[-1]),
            np.full(self.steps, float(observation.width[-1])),
            np.ones(self.steps, bool),
        )
