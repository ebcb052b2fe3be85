"""The rig's bimanual task in closed loop: each gripper's demonstration succeeds, holding still does
not, and a rollout repeats byte for byte."""

from __future__ import annotations

import numpy as np

from policypipe.rollout.episode import RolloutConfig, episode_clocks
from policypipe.rollout.references import DemonstrationReplay, HoldStill, training_demonstrations
from policypipe.rollout.report import CONTROLLERS, RolloutStageConfig, report, run_rollouts
from policypipe.rollout.rig import PerGripper, rig_rollout_scene, run_rig_episode
from tests.dataset.test_rig import rig_dataset, rig_export  # noqa: F401 - fixtures
from tests.runtime.test_rig_runtime import rig_policy  # noqa: F401 - a fixture
from tests.training.test_rig_training import rig_stats  # noqa: F401 - a fixture

CONFIG = RolloutConfig(camera_size=(64, 48))


def demonstrator(seed: int) -> PerGripper:
    return PerGripper([DemonstrationReplay(p, CONFIG.frequency_hz) for p in rig_rollout_scene(seed, 2).plans])


def test_each_grippers_demonstration_places_its_block_and_holding_still_places_none() -> None:
    for seed in (0, 1):
        result = run_rig_episode(demonstrator(seed), seed, CONFIG)
        assert result.gripper_outcomes == ("success", "success") and result.outcome == "success", result
        assert result.distance_to_mark_m < 0.02
    still = run_rig_episode(PerGripper([HoldStill(CONFIG.frequency_hz)] * 2), 0, CONFIG)
    assert (
        still.gripper_outcomes == ("never_closed_on_block",) * 2 and still.outcome == "never_closed_on_block"
    )


def test_one_gripper_failing_fails_the_episode_and_is_named() -> None:
    plans = rig_rollout_scene(0, 2).plans
    half = PerGripper([DemonstrationReplay(plans[0], CONFIG.frequency_hz), HoldStill(CONFIG.frequency_hz)])
    result = run_rig_episode(half, 0, CONFIG)
    assert result.gripper_outcomes == ("success", "never_closed_on_block")
    assert result.outcome == "never_closed_on_block"


def test_the_streams_have_their_own_clocks_and_a_rollout_repeats_byte_for_byte() -> None:
    cameras, poses, _ = episode_clocks(3, 2, 0, 5 * 10**9, scene_camera=True)
    assert set(cameras) == {0, 1, 2} and not np.array_equal(cameras[0], cameras[1])
    assert abs(np.median(np.diff(cameras[2])) / 1e9 - 1 / 20) < 0.002  # the scene camera's 20 Hz
    assert not np.array_equal(poses[0], poses[1])
    a = run_rig_episode(demonstrator(2), 2, CONFIG)
    b = run_rig_episode(demonstrator(2), 2, CONFIG)
    assert a.gripper_outcomes == b.gripper_outcomes and a.duration_s == b.duration_s
    assert np.array_equal(a.final_frame, b.final_frame)


def test_the_stage_rolls_out_a_rig_policy_driving_every_gripper_beside_its_references(
    rig_policy,  # noqa: F811
    rig_stats,  # noqa: F811
) -> None:
    import json

    stats = json.loads(rig_stats[1].read_text())
    demonstrations = [training_demonstrations(rig_stats[0], stats, g) for g in (0, 1)]
    assert all(len(d) == len(stats["split"]["train"]) for d in demonstrations)
    assert not np.allclose(demonstrations[0][0].position, demonstrations[1][0].position)
    stage = RolloutStageConfig(episodes=2, time_limit_s=0.4, videos=0)
    results = run_rollouts(rig_policy, stage, 1, demonstrations)
    metrics = report(results, stage)
    assert metrics["scenes"]["rule"].startswith("rig.rig_rollout_scene")
    for controller in CONTROLLERS:
        assert set(metrics[controller]["per_gripper"]) == {"robot0", "robot1"}
        assert all(len(r.gripper_outcomes) == 2 for r in results[controller])
    # Within 0.4 s nothing is placed; the final frames are the scene camera's, of the policy's motion.
    assert metrics["policy"]["success_rate"] == 0
    policy_frames = [r.final_frame for r in results["policy"]]
    still_frames = [r.final_frame for r in results["hold_still"]]
    assert policy_frames[0].shape == (240, 320, 3)
    assert any(not np.array_equal(a, b) for a, b in zip(policy_frames, still_frames))
