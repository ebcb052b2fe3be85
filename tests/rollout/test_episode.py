"""Closed-loop episodes: references and a real runner drive the simulator through the harness."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.rollout.episode import (
    RolloutConfig,
    rollout_scene,
    run_episode,
    stream_clocks,
)
from policypipe.rollout.references import (
    Demonstration,
    DemonstrationReplay,
    HoldStill,
    NearestDemonstrationReplay,
    nearest_demonstration,
    training_demonstrations,
)
from policypipe.rollout.report import RolloutStageConfig, record_videos, report, run_rollouts
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.export import SampleConfig
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.simulator import NS, SimConfig
from tests.runtime.test_runner import pipeline  # noqa: F401 (a fixture)

CONFIG = RolloutConfig()


def test_the_demonstration_replayed_through_the_harness_succeeds() -> None:
    outcomes = Counter(
        run_episode(DemonstrationReplay(rollout_scene(seed), CONFIG.frequency_hz), seed, CONFIG).outcome
        for seed in range(6)
    )
    assert outcomes == {"success": 6}


def test_rollout_scenes_are_new_and_fixed_by_their_seed() -> None:
    """No rollout scene is a scene of a sample export (seeds 0-3, the demo's 96 recordings each:
    the export seeds recording i of seed s with SeedSequence([s, i]), as `export.py` does)."""
    recorded = set()
    for export_seed in range(4):
        for i in range(SampleConfig().recordings):
            plan_seq = np.random.SeedSequence([export_seed, i]).spawn(4)[0]
            recorded.add(tuple(plan_motion(np.random.default_rng(plan_seq), 0).scene.target_xy))
    scenes = [tuple(rollout_scene(seed).scene.target_xy) for seed in range(50)]
    assert len(set(scenes)) == 50 and recorded.isdisjoint(scenes)
    assert scenes[3] == tuple(rollout_scene(3).scene.target_xy)


def test_the_streams_have_a_recordings_timing() -> None:
    """Camera frames at 30 Hz with jitter and drops, poses at 120-200 Hz, openings at ~45 Hz."""
    camera, pose, width = stream_clocks(3, 0, 14 * 10**9)
    gaps = np.diff(camera) / 1e6  # ms
    on_time = gaps[gaps < 50]
    assert 0.3 < on_time.std() < 3 and abs(on_time.mean() - 1000 / 30) < 0.2
    assert 1 <= (gaps > 50).sum() <= 0.05 * len(gaps)  # dropped frames leave gaps of two periods
    assert 120 <= len(pose) / 14 <= 201 and 41 <= len(width) / 14 <= 49
    assert np.array_equal(camera, stream_clocks(3, 0, 14 * 10**9)[0])


class _Watching(HoldStill):
    """Holding still, noting how old each observation's latest frame is when it is asked."""

    def __init__(self) -> None:
        super().__init__(CONFIG.frequency_hz)
        self.ages_ms: list[float] = []
        self.pose_rates: list[float] = []

    def act(self, observation, now_ns=None, episode_start_ns=None):
        self.ages_ms.append((now_ns - observation.frame_ns[-1]) / 1e6)
        self.pose_rates.append(1e9 * (len(observation.pose_ns) - 1) / np.ptp(observation.pose_ns))
        assert observation.pose_ns[-1] >= observation.frame_ns[-1] <= observation.width_ns[-1]
        return super().act(observation, now_ns, episode_start_ns)


def test_the_controller_gets_what_a_robot_has_when_it_asks() -> None:
    """The latest frame the pose and opening streams cover: up to a width period (and a frame) old."""
    watching = _Watching()
    run_episode(watching, 2, RolloutConfig(time_limit_s=3.0, camera_size=(64, 48)))
    assert 0 <= min(watching.ages_ms) and max(watching.ages_ms) < 1000 / 45 + 2 * 1000 / 30
    assert len(set(np.round(watching.ages_ms))) > 3  # not a fixed lag: the clocks run apart
    assert all(115 < rate < 205 for rate in watching.pose_rates)


class _SeeingTheScene(DemonstrationReplay):
    """The scene's demonstration, noting every frame of the scene camera (camera 1) it is sent."""

    def __init__(self, seed: int) -> None:
        super().__init__(rollout_scene(seed), CONFIG.frequency_hz)
        self.scene_frames: dict[int, np.ndarray] = {}

    def act(self, observation, now_ns=None, episode_start_ns=None):
        scene = observation.cameras[1]
        self.scene_frames |= dict(zip(scene.frame_ns.tolist(), scene.frames))
        return super().act(observation, now_ns, episode_start_ns)


def test_one_gripper_with_a_scene_camera_sees_the_fixed_view_at_its_rate_in_the_same_episode() -> None:
    """`sample --scene-camera` policies: the scene camera is camera 1 at 20 Hz, and the episode, its
    wrist camera and its scene are the ones without it."""
    config = replace(CONFIG, time_limit_s=4.0, camera_size=(64, 48))
    seeing = _SeeingTheScene(4)
    with_it = run_episode(seeing, 4, config, keep_frames=True, scene_camera=True)
    without = run_episode(
        DemonstrationReplay(rollout_scene(4), CONFIG.frequency_hz), 4, config, keep_frames=True
    )
    assert with_it.duration_s == without.duration_s
    assert with_it.distance_to_mark_m == without.distance_to_mark_m
    times = np.array(sorted(seeing.scene_frames))
    assert 18 < 1e9 * (len(times) - 1) / np.ptp(times) < 20.5
    # The result's frames are the scene camera's: its clock, and a view in which the table stays
    # put (the wrist camera's moves with the gripper from the first frame to the last).
    assert with_it.frame_times_s != without.frame_times_s
    first, last = (np.asarray(with_it.frames[i], float) for i in (0, -1))
    wrist_first, wrist_last = (np.asarray(without.frames[i], float) for i in (0, -1))
    assert np.median(np.abs(last - first)) < 0.5 * np.median(np.abs(wrist_last - wrist_first))


class _Recording(DemonstrationReplay):
    """The scene's demonstration, noting every pose and held-object report it is sent."""

    def __init__(self, seed: int) -> None:
        super().__init__(rollout_scene(seed), CONFIG.frequency_hz)
        self.poses: dict[int, np.ndarray] = {}
        self.holding: list[bool] = []

    def act(self, observation, now_ns=None, episode_start_ns=None):
        self.poses |= dict(zip(observation.pose_ns.tolist(), observation.position))
        self.holding.append(observation.grippers[0].holding_at(observation.frame_ns[-1]))
        return super().act(observation, now_ns, episode_start_ns)


def test_a_loop_that_knows_its_latency_sends_targets_early_so_that_they_take_effect_on_time() -> None:
    def poses(config: RolloutConfig) -> dict[int, np.ndarray]:
        replay = _Recording(4)
        assert run_episode(replay, 4, config).outcome == "success"
        return replay.poses

    ideal = poses(CONFIG)
    late = SimConfig(latency_ns=60_000_000)
    compensated = poses(replace(CONFIG, sim=late, compensate_latency=True))
    uncompensated = poses(replace(CONFIG, sim=late, compensate_latency=False))
    start = rollout_scene(4).start_ns + NS // 5  # past the steps the first request is too late for
    common = [t for t in compensated if t > start and t in ideal]
    assert len(common) > 500
    # The same path at the same times, but for where the chunks' own times fall (requests come
    # 60 ms earlier, so the targets are spaced from other frames): tenths of a millimetre.
    assert max(np.linalg.norm(compensated[t] - ideal[t]) for t in common) < 2e-4
    assert max(np.linalg.norm(uncompensated[t] - ideal[t]) for t in common if t in uncompensated) > 0.005


def test_the_simulated_gripper_reports_the_block_it_holds() -> None:
    replay = _Recording(2)
    assert run_episode(replay, 2, CONFIG).outcome == "success"
    held = np.flatnonzero(replay.holding)
    # Open at the start, holding from the grasp to the release: one span.
    assert not replay.holding[0] and len(held) > 10 and np.all(np.diff(held) == 1)


class _LooseClose(DemonstrationReplay):
    """The scene's demonstration, but its close ends 0.3 mm wider than the block, after dipping 0.5 mm
    below it for 40 ms: a policy's closing chunk, composed on the open reading, that stops a hair too
    wide (what the privileged control's chunks did, docs/rollout.md)."""

    def act(self, observation, now_ns=None, episode_start_ns=None):
        times = self.times(observation)
        width = self.plan.width_at(times)
        narrow = self.plan.scene.target_size[0]
        dense = np.arange(self.plan.start_ns, self.plan.end_ns, NS // 1000, dtype=np.int64)
        meets = dense[np.argmax(self.plan.width_at(dense) < narrow)]  # the fingers reach the block
        release = self.plan.events_ns["release"]
        width = np.where((times >= meets) & (times < release), narrow + 0.0003, width)
        width = np.where((times >= meets) & (times < meets + 40_000_000), narrow - 0.0005, width)
        return self.chunk(times, *self.plan.pose_at(times), width)


def test_the_loop_holds_a_grip_that_a_chunk_composed_on_the_open_fingers_would_let_go() -> None:
    # The runner's deadband compares a step's opening with the reading at the chunk's observation:
    # a chunk asked for with the fingers open never "opens" them, and its close that stops 0.3 mm
    # wider than the block grips it and lets it go at the next step, where it lay. The loop holds
    # the grip against the reading at each step (chunk.width_to_send), and the task goes on.
    seed = 5
    loose = run_episode(_LooseClose(rollout_scene(seed), CONFIG.frequency_hz), seed, CONFIG)
    assert loose.outcome == "placed_off_mark" and loose.releases[0]["from_mark_m"] > 0.1
    held = run_episode(
        _LooseClose(rollout_scene(seed), CONFIG.frequency_hz), seed, replace(CONFIG, hold_grip_m=0.01)
    )
    assert held.outcome == "success"
    # The demonstration itself is unchanged by the hold: its opening at the mark passes the deadband.
    replay = DemonstrationReplay(rollout_scene(seed), CONFIG.frequency_hz)
    assert run_episode(replay, seed, replace(CONFIG, hold_grip_m=0.01)).outcome == "success"


def demonstration_of(seed: int) -> Demonstration:
    """Rollout scene `seed`'s demonstration at 30 Hz, as a training episode stores it."""
    plan = rollout_scene(seed)
    times = np.arange(plan.start_ns, plan.end_ns, NS // 30, dtype=np.int64)
    position, quaternion = plan.pose_at(times)
    return Demonstration(f"scene{seed}", (times - times[0]) / NS, position, quaternion, plan.width_at(times))


def test_the_nearest_demonstration_is_replayed_from_the_episodes_start() -> None:
    demonstrations = [demonstration_of(seed) for seed in range(5)]
    plan = rollout_scene(3)
    position, quaternion = (a[0] for a in plan.pose_at(np.array([plan.start_ns])))
    nearest = nearest_demonstration(demonstrations, position, quaternion)
    assert nearest.stem == "scene3"
    # Its own scene, from its own start: the demonstration itself, which succeeds.
    replay = NearestDemonstrationReplay(nearest, plan.start_ns, position, quaternion, CONFIG.frequency_hz)
    assert run_episode(replay, 3, CONFIG).outcome == "success"
    # From a start 5 cm away and turned by 30 degrees: the same motion, moved rigidly.
    turn = Rotation.from_euler("z", 30, degrees=True)
    moved = NearestDemonstrationReplay(
        nearest,
        plan.start_ns,
        position + [0.05, 0.0, 0.0],
        (turn * Rotation.from_quat(quaternion)).as_quat(),
        CONFIG.frequency_hz,
    )
    observation = type("Frames", (), {"frame_ns": np.array([plan.start_ns + NS])})()
    a, b = replay.act(observation), moved.act(observation)
    np.testing.assert_allclose(
        b.position - position - [0.05, 0, 0], turn.apply(a.position - position), atol=1e-9
    )


def test_holding_still_never_closes() -> None:
    result = run_episode(HoldStill(CONFIG.frequency_hz), 0, RolloutConfig(time_limit_s=1.0))
    assert result.outcome == "never_closed_on_block" and 1.0 <= result.duration_s < 1.1


def test_a_runner_in_closed_loop_gives_the_same_episode_twice(pipeline) -> None:  # noqa: F811
    config = RolloutConfig(time_limit_s=0.8, camera_size=(64, 48))
    first = run_episode(PolicyRunner.load(pipeline.policy, seed=0), 5, config, keep_frames=True)
    again = run_episode(PolicyRunner.load(pipeline.policy, seed=0), 5, config, keep_frames=True)
    assert first.outcome == again.outcome and first.duration_s == again.duration_s >= 0.8
    assert len(first.frames) == len(again.frames) >= 22  # 0.8 s at 30 Hz, less a dropped frame or two
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first.frames, again.frames))


def test_the_outcomes_do_not_depend_on_the_number_of_workers(pipeline) -> None:  # noqa: F811
    stage = RolloutStageConfig(episodes=2, time_limit_s=0.3, videos=0)
    demonstrations = [training_demonstrations(pipeline.store, pipeline.stats)]
    here, pooled = (run_rollouts(pipeline.policy, stage, workers, demonstrations) for workers in (1, 2))
    assert report(here, stage) == report(pooled, stage)
    assert [r.final_frame.tobytes() for r in here["policy"]] == [
        r.final_frame.tobytes() for r in pooled["policy"]
    ]


def test_each_finished_episode_is_reported_in_order_for_the_stages_progress(pipeline) -> None:  # noqa: F811
    stage = RolloutStageConfig(episodes=2, first_seed=3, time_limit_s=0.2, videos=0)
    for workers in (1, 2):
        reported: list[tuple[str, int]] = []

        def progress(controller: str, result, reported=reported) -> None:
            reported.append((controller, result.seed))

        # No demonstrations: holding still replays none.
        results = run_rollouts(pipeline.policy, stage, workers, [[]], ("policy", "hold_still"), progress)
        assert reported == [("policy", 3), ("policy", 4), ("hold_still", 3), ("hold_still", 4)]
        assert [r.seed for r in results["hold_still"]] == [3, 4]


def test_a_video_holds_the_episode_frame_by_frame_at_the_camera_rate(pipeline, tmp_path) -> None:  # noqa: F811
    import av

    stage = RolloutStageConfig(episodes=1, time_limit_s=0.3, videos=1)
    (video,) = record_videos(pipeline.policy, stage, [0], tmp_path)
    episode = run_episode(PolicyRunner.load(pipeline.policy), 0, stage.episode_config(30.0), keep_frames=True)
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        assert stream.average_rate == 30 and (stream.width, stream.height) == (320, 240)
    assert len(decoded) == len(episode.frames) and video.name == f"policy_seed0000_{episode.outcome}.mp4"
    # Lossy, but the same pictures: a few levels of 255 on average.
    assert np.abs(np.stack(decoded).astype(int) - np.stack(episode.frames)).mean() < 4
    assert not list(tmp_path.glob("*.partial"))
