"""Closed-loop episodes: references and a real runner drive the simulator through the harness."""

from __future__ import annotations

from collections import Counter

import numpy as np

from policypipe.rollout.episode import (
    DemonstrationReplay,
    HoldStill,
    RolloutConfig,
    rollout_scene,
    run_episode,
)
from policypipe.rollout.report import RolloutStageConfig, record_videos, report, run_rollouts
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.export import SampleConfig
from policypipe.synthetic.motion import plan_motion
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


def test_holding_still_never_closes() -> None:
    result = run_episode(HoldStill(CONFIG.frequency_hz), 0, RolloutConfig(time_limit_s=1.0))
    assert result.outcome == "never_closed_on_block" and 1.0 <= result.duration_s < 1.1


def test_a_runner_in_closed_loop_gives_the_same_episode_twice(pipeline) -> None:  # noqa: F811
    config = RolloutConfig(time_limit_s=0.8, camera_size=(64, 48))
    first = run_episode(PolicyRunner.load(pipeline.policy, seed=0), 5, config, keep_frames=True)
    again = run_episode(PolicyRunner.load(pipeline.policy, seed=0), 5, config, keep_frames=True)
    assert first.outcome == again.outcome and first.duration_s == again.duration_s >= 0.8
    assert len(first.frames) == len(again.frames) > 24
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first.frames, again.frames))


def test_the_outcomes_do_not_depend_on_the_number_of_workers(pipeline) -> None:  # noqa: F811
    stage = RolloutStageConfig(episodes=2, time_limit_s=0.3, videos=0)
    here, pooled = (run_rollouts(pipeline.policy, stage, workers) for workers in (1, 2))
    assert report(here, stage) == report(pooled, stage)
    assert [r.final_frame.tobytes() for r in here["policy"]] == [
        r.final_frame.tobytes() for r in pooled["policy"]
    ]


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
