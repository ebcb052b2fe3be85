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

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.runtime.chunk import width_to_send
from policypipe.runtime.observation import CameraFrames, GripperState, Observation
from policypipe.synthetic.motion import MotionPlan, plan_motion
from policypipe.synthetic.privileged import scene_state
from policypipe.synthetic.recording import StreamTiming, random_timing, sample_clock
from policypipe.synthetic.render import render_fixed_view_bgr, render_view_bgr, table_texture
from policypipe.synthetic.rig import SCENE_CAMERA_HZ, SCENE_CAMERA_JITTER_S, RigPlan
from policypipe.synthetic.scene import Scene
from policypipe.synthetic.simulator import NS, SimConfig, SimState, Simulator, start_state

# First word of every rollout scene's seed: far above any sample export's seed.
ROLLOUT_ENTROPY = 0x5EED_2200_0000
START_NS = 1_900_000_000 * NS  # the scenes' clock starts here (any value: times are relative)
LEAD_IN_NS = NS // 2  # the streams run this long, the gripper still, before the episode starts
HISTORY_NS = NS // 2  # pose and opening samples sent with each request: the last half second
RIG_SCENES = 2  # second word of a rig scene's seed (`rig.rig_rollout_scene`) and its scene camera's clock
SCENE_CAMERA_DROP_FRACTION = 0.03


class Chunk(Protocol):
    time_ns: np.ndarray  # (H,)
    grippers: dict  # gripper i -> its targets: position (H, 3), quaternion (H, 4), width (H,)
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
    # The robot-side loop knows the simulator's latency, as a robot's loop measures its own: it
    # passes the controller the time its targets will take effect and sends each target that much
    # before the target's time, so that it takes effect at it (UMI's latency matching). False: it
    # sends each target at its time, and the latency delays it.
    compensate_latency: bool = True
    # While the gripper reports holding the block, a step's width target above its reading by less
    # than this keeps the reading (`chunk.width_to_send`): the robot-side loop applies the policy's
    # deadband at every step against the fingers' reading then. 0: the targets as they are.
    hold_grip_m: float = 0.0


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    outcome: str
    duration_s: float
    distance_to_mark_m: float
    final_frame: np.ndarray  # RGB, the camera's last view
    frames: list[np.ndarray]  # RGB, every frame the camera captured (kept only when asked)
    frame_times_s: tuple[float, ...] = ()  # each kept frame's capture time from the episode's start
    missed_closes: list[dict[str, float]] = field(default_factory=list)  # `Simulator.missed_closes`
    # `Simulator.released_at`, each gripper's
    releases: list[dict[str, float | bool]] = field(default_factory=list)
    # A rig's episode (`rig.run_rig_episode`): each gripper's own outcome; `outcome` is "success"
    # when all are, else the first failing gripper's.
    gripper_outcomes: tuple[str, ...] = ()
    # The runtime monitor's readings (`monitor.scores.MonitorReading`) of the chunks the controller
    # was asked for, each with its time in seconds from the episode's start (`rollout.monitoring`).
    monitor: tuple[tuple[float, object], ...] = ()


def episode_noise_seed(runner_seed: int, scene: int) -> int:
    """The seed of a policy runner's noise for one episode: a fresh sequence per scene, so that an
    episode does not depend on which ran before it."""
    return runner_seed * 1_000_003 + scene


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
        # position (3), quaternion (4), width, block centre (3), yaw, held (1 or 0)
        self.rows: list[np.ndarray] = []
        self.add(state)

    def add(self, s: SimState) -> None:
        row = np.concatenate([s.position, s.quaternion, [s.width], s.block_centre, [s.block_yaw, s.held]])
        if self.t and s.t_ns <= self.t[-1]:  # a target that takes effect no later: it replaces the last
            self.rows[-1] = row
        else:
            self.t.append(int(s.t_ns))
            self.rows.append(row)

    def at(self, times: np.ndarray) -> np.ndarray:
        """(N, 13) states at `times` (held before the first step and after the last): linear between
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
    controller: Controller,
    seed: int,
    config: RolloutConfig,
    keep_frames: bool = False,
    scene_camera: bool = False,
) -> EpisodeResult:
    """One episode of the single-gripper task in scene `seed` (`rollout_scene`); with `scene_camera`,
    camera 1 is the fixed scene camera of a one-gripper rig (`sample --scene-camera`), and the
    result's frames are its."""
    plan = RigPlan((rollout_scene(seed),))
    return run_rig_plan(controller, seed, plan, config, scene_camera, keep_frames)


def run_rig_plan(
    controller: Controller,
    seed: int,
    rig: RigPlan,
    config: RolloutConfig,
    scene_camera: bool,
    keep_frames: bool = False,
    on_step: Callable[[int, list[Simulator]], None] | None = None,
) -> EpisodeResult:
    """One episode of `rig`'s grippers, each with its own block (one gripper: the single task).
    Camera i is gripper i's wrist camera; with `scene_camera`, camera N is the rig's scene camera,
    whose frames the result's are (camera 0's without one). `on_step(t_ns, simulators)` is called
    after every executed step (`corrections` takes over from the states it sees)."""
    grippers = len(rig.plans)
    texture = table_texture(rig.table, tuple((p.scene.place_xy, p.scene.place_yaw) for p in rig.plans))
    t0 = rig.start_ns
    end_ns = t0 + int(round(config.time_limit_s * NS))
    sims, trajectories = [], []
    for plan in rig.plans:
        position, quaternion = plan.pose_at(np.array([t0]))
        width = float(plan.width_at(np.array([t0]))[0])
        sim = Simulator(
            plan.scene, start_state(plan.scene, t0, position[0], quaternion[0], width), config.sim
        )
        sims.append(sim)
        trajectories.append(_Trajectory(sim.state))
    # The streams run from before the start to past the time limit; a chunk may overshoot it by a step.
    camera_ns, pose_ns, width_ns = episode_clocks(seed, grippers, t0 - LEAD_IN_NS, end_ns + NS, scene_camera)
    rendered: dict[tuple[int, int], np.ndarray] = {}  # (camera, capture time) -> RGB, rendered once

    def frame(k: int, t_ns: int) -> np.ndarray:
        if (k, t_ns) not in rendered:
            states = [trajectory.state_at(t_ns) for trajectory in trajectories]
            rendered[k, t_ns] = _view(rig, texture, states, k, config.camera_size)
        return rendered[k, t_ns]

    def observe(now: int) -> Observation:
        """What has arrived by `now`: camera 0's frames that every gripper's pose and opening streams
        cover, every other camera's frames so far, and those streams."""
        seen, covered = {}, now
        for i in range(grippers):
            poses = pose_ns[i][(pose_ns[i] <= now) & (pose_ns[i] > now - HISTORY_NS)]
            widths = width_ns[i][(width_ns[i] <= now) & (width_ns[i] > now - HISTORY_NS)]
            states, openings = trajectories[i].at(poses), trajectories[i].at(widths)
            # The gripper reports a held object with each opening, as a real one's object detection.
            seen[i] = GripperState(
                poses, states[:, :3], states[:, 3:7], widths, openings[:, 7], openings[:, 12] >= 0.5
            )
            covered = min(covered, int(poses[-1]), int(widths[-1]))
        cameras = {}
        for k, ns in camera_ns.items():
            times = ns[ns <= (covered if k == 0 else now)][-config.history_frames :]
            if len(times):
                cameras[k] = CameraFrames(times, np.stack([frame(k, int(t)) for t in times]))
        observation = Observation.checked(**Observation(cameras, seen).fields())
        if grippers > 1:
            return observation
        # The privileged control's observation (`synthetic.privileged`): the scene at camera 0's frames.
        states = trajectories[0].at(observation.frame_ns)
        state = scene_state(
            states[:, :3],
            Rotation.from_quat(states[:, 3:7]).as_matrix(),
            states[:, 8:11],
            states[:, 11],
            rig.plans[0].scene.place_xy,
        )
        return replace(observation, scene_state=state)

    # The episode starts with the streams' first frame: they ran LEAD_IN_NS with the grippers still
    # before t0, as a recording's first frames see them still.
    first_ns = int(camera_ns[0][0])
    lead_ns = config.sim.latency_ns if config.compensate_latency else 0
    now = t0
    while now < end_ns and not all(sim.done() for sim in sims):
        chunk = controller.act(observe(now), now_ns=now + lead_ns, episode_start_ns=first_ns)
        steps = np.flatnonzero(chunk.execute & (chunk.time_ns > now + lead_ns))
        if len(steps) == 0:
            raise ValueError(
                f"the controller's chunk at t = {now} ns executes no step: it would wait forever"
            )
        for k in steps:
            now = int(chunk.time_ns[k]) - lead_ns  # sent now, it takes effect at its time
            for i, sim in enumerate(sims):
                if not sim.done():  # a released block's gripper holds still
                    targets = chunk.grippers[i]
                    s = sim.state  # the gripper's reading and report as the step is sent
                    width = width_to_send(float(targets.width[k]), s.width, s.held, config.hold_grip_m)
                    trajectories[i].add(sim.step(now, targets.position[k], targets.quaternion[k], width))
            if on_step is not None:
                on_step(now, sims)
            if all(sim.done() for sim in sims) or now >= end_ns:
                break
    outcomes = tuple(sim.outcome() for sim in sims)
    failed = [o for o in outcomes if o != "success"]
    shown = grippers if scene_camera else 0
    ns = camera_ns[shown]
    kept = ns[(ns >= t0) & (ns <= now)] if keep_frames else ns[:0]
    frames = [frame(shown, int(t)) for t in kept]
    return EpisodeResult(
        seed=seed,
        outcome=failed[0] if failed else "success",
        duration_s=(now - t0) / NS,
        distance_to_mark_m=max(sim.distance_to_mark() for sim in sims),
        final_frame=frame(shown, int(ns[ns <= now][-1])),
        frames=frames,
        frame_times_s=tuple(float(t - t0) / NS for t in kept),
        missed_closes=[m for sim in sims for m in sim.missed_closes],
        releases=[sim.released_at for sim in sims if sim.released_at is not None],
        gripper_outcomes=outcomes if grippers > 1 else (),
    )


def episode_clocks(
    seed: int, grippers: int, start_ns: int, stop_ns: int, scene_camera: bool
) -> tuple[dict[int, np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """({camera: its frames' capture times}, per gripper its poses', per gripper its openings'):
    gripper 0's as `stream_clocks` draws them for the seed, every other gripper's drawn alike from
    a seed of its own, the scene camera's at SCENE_CAMERA_HZ with its jitter and drops."""
    cameras, poses, widths = {}, [], []
    for i in range(grippers):
        camera, pose, width = stream_clocks(seed if i == 0 else seed + (i << 40), start_ns, stop_ns)
        cameras[i] = camera
        poses.append(pose)
        widths.append(width)
    if scene_camera:
        rng = np.random.default_rng(np.random.SeedSequence([ROLLOUT_ENTROPY, RIG_SCENES, seed, 2]))
        scene = sample_clock(rng, start_ns, stop_ns, SCENE_CAMERA_HZ, SCENE_CAMERA_JITTER_S)
        cameras[grippers] = scene[rng.random(len(scene)) >= SCENE_CAMERA_DROP_FRACTION]
    return cameras, poses, widths


def _view(
    rig: RigPlan, texture: np.ndarray, states: list[SimState], camera: int, size: tuple[int, int]
) -> np.ndarray:
    """(H, W, 3) RGB: camera `camera` of the rig (gripper i's wrist camera is camera i, the scene
    camera the one after them) on the simulated states."""
    blocks = [(s.block_centre, s.block_yaw, p.scene.target_size) for s, p in zip(states, rig.plans)]
    if camera < len(states):
        others = tuple(b for j, b in enumerate(blocks) if j != camera)
        return camera_view(rig.plans[camera].scene, texture, states[camera], size, others)
    r_cam, centre = rig.scene_camera()
    grippers = [(s.position, s.quaternion, s.width) for s in states]
    bgr = render_fixed_view_bgr(rig.table, texture, r_cam, centre, blocks, grippers, size)
    return np.ascontiguousarray(bgr[..., ::-1])


def camera_view(
    scene: Scene, texture: np.ndarray, state: SimState, size: tuple[int, int], other_blocks: tuple = ()
) -> np.ndarray:
    """(H, W, 3) uint8 RGB: what the wrist camera sees of the simulated state (and of `other_blocks`,
    (centre, yaw, size) each: another gripper's, in a rig)."""
    bgr = render_view_bgr(
        scene,
        texture,
        state.position,
        state.quaternion,
        state.block_centre,
        state.block_yaw,
        state.width,
        size,
        other_blocks,
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
