"""A joint-space policy evaluated against its baselines on a converted ALOHA dataset; the baselines
checked on windows whose answer is known."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import zarr

from policypipe.dataset.joint_windows import JointSeries
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.errors import joint_constant_velocity, joint_errors, joint_hold_still
from policypipe.evaluation.evaluate import EvalConfig
from policypipe.evaluation.joint_space import BASELINES, JointBaselines, evaluate_joint_space
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.config import model_for_dataset
from tests.recordings.aloha_files import convert_aloha
from tests.training.conftest import MODEL

WINDOW = WindowConfig(2, 8, 4)
CONFIG = EvalConfig(stride=5, batch_size=16, bootstrap_resamples=200)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    store, _ = convert_aloha(tmp_path_factory.mktemp("aloha"), episodes=7)
    stats = compute_statistics(
        zarr.open_group(store, mode="r"), WINDOW, StatsConfig(val_fraction=0.3, test_fraction=0.3)
    )
    torch.manual_seed(0)
    policy = DiffusionPolicy(
        model_for_dataset(replace(MODEL, image_size=(20, 16), crop_size=(18, 14)), stats)
    )
    policy.fit_normalizers(stats)
    return store, stats, policy.eval()


def test_errors_average_the_arm_joints_and_the_grippers_apart() -> None:
    recorded = np.zeros((1, 2, 4))
    predicted = np.array([[[0.1, 0.3, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]])
    errors = joint_errors(predicted, recorded, gripper_dims=[3])
    np.testing.assert_allclose(errors["joints"], [[0.4 / 3, 0.0]])
    np.testing.assert_allclose(errors["grippers"], [[1.0, 0.0]])
    assert set(joint_errors(predicted, recorded, gripper_dims=[])) == {"joints"}


def test_hold_still_keeps_the_current_vector_and_constant_velocity_continues_its_motion() -> None:
    obs = np.array([[[1.0, 5.0], [2.0, 5.0]]])  # previous, current
    np.testing.assert_array_equal(joint_hold_still(obs, 3)[0], [[2.0, 5.0]] * 3)
    np.testing.assert_array_equal(joint_constant_velocity(obs, 3)[0], [[3.0, 5.0], [4.0, 5.0], [5.0, 5.0]])


def test_the_nearest_neighbour_of_a_training_window_is_its_own_chunk(setup) -> None:
    store, stats, _ = setup
    config = replace(CONFIG, nn_k=1)
    baselines = JointBaselines.build(store, stats, WINDOW, config)
    samples = collect_samples(store, stats["split"]["train"][:2], WINDOW, stride=3)
    chunks, _ = baselines.chunks(samples)
    recorded = samples.batch["action"].double().numpy()
    # Its own chunk, relative to its own state and back: equal to float rounding.
    np.testing.assert_allclose(chunks["nearest_neighbour"], recorded, atol=1e-6)
    assert np.abs(chunks["hold_still"] - recorded).mean() > 1e-3


def test_a_joint_space_policy_is_evaluated_on_both_sides_against_every_baseline(setup) -> None:
    store, stats, policy = setup
    result = evaluate_joint_space(policy, store, stats, CONFIG)
    report = result["report"]
    assert report["headline"] == "test" and report["representation"] == "joint"
    for side in ("test", "validation"):
        r = report[side]
        assert r["episodes"] == len(stats["split"]["test" if side == "test" else "val"])
        for name in (
            "policy",
            *BASELINES,
            "camera_ablation_constant_image",
            "camera_ablation_absent_camera1",
        ):
            assert r[name]["joints"]["executed"]["mean"] > 0, name
        assert r["best_baseline"]["joints"] in BASELINES
        low, high = r["ratio_to_best_baseline_ci95"]["joints"].values()
        assert low <= r["ratio_to_best_baseline"]["joints"] <= high
        assert set(r["per_joint_executed"]["policy"]) == set(stats["joints"]["names"])
    # The grippers close linearly in these files, and a command is the next row's vector: constant
    # velocity one period ahead is exact for them, but where an episode's start or end is padded.
    assert report["test"]["constant_velocity"]["grippers"]["executed"]["median"] < 1e-6
    assert [row["step"] for row in result["per_step"]] == list(range(1, WINDOW.horizon + 1))
    assert result["chunks"]["policy"].shape[1:] == (WINDOW.horizon, 14)


def test_a_pose_policy_is_not_evaluated_as_a_joint_space_one(setup) -> None:
    store, stats, _ = setup
    with pytest.raises(ValueError, match="takes a joint-space policy"):
        evaluate_joint_space(DiffusionPolicy(MODEL), store, stats, CONFIG)


def test_statistics_of_one_kind_do_not_fit_a_policy_of_the_other(setup) -> None:
    _, stats, _ = setup
    with pytest.raises(
        ValueError, match="statistics are of a joint-space dataset, the policy is a gripper pose"
    ):
        DiffusionPolicy(MODEL).fit_normalizers(stats)


def test_the_series_knows_its_grippers(setup) -> None:
    store, _, _ = setup
    series = JointSeries.from_store(zarr.open_group(store, mode="r"))
    assert [series.joint_names[d] for d in series.gripper_dims] == ["left_gripper", "right_gripper"]


def test_compare_refuses_a_joint_space_policy_naming_the_eval_stage(setup) -> None:
    from policypipe.evaluation.evaluate import compare_policies

    store, stats, policy = setup
    with pytest.raises(ValueError, match="compare takes gripper-pose policies so far"):
        compare_policies([policy], None, store, stats, CONFIG)
