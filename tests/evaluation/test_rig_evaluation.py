"""Evaluation of a rig policy (two grippers, three cameras): errors and baselines per gripper and
as a whole, and the camera ablation per camera."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policypipe.evaluation.errors import chunk_errors, constant_velocity, hold_still
from policypipe.evaluation.evaluate import (
    BASELINES,
    COMPONENTS,
    EvalConfig,
    evaluate,
)
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.config import model_for_dataset
from tests.dataset.test_rig import SCENE, rig_dataset, rig_export  # noqa: F401 - fixtures
from tests.training.conftest import WINDOW
from tests.training.test_rig_training import MODEL, rig_stats  # noqa: F401 - a fixture

CONFIG = EvalConfig(stride=6, batch_size=32, spread_samples=2, spread_observations=2, bootstrap_resamples=200)


@pytest.fixture(scope="module")
def rig_report(rig_stats) -> dict:  # noqa: F811
    store, stats_path = rig_stats
    stats = json.loads(stats_path.read_text())
    torch.manual_seed(0)
    policy = DiffusionPolicy(model_for_dataset(MODEL, stats))
    policy.fit_normalizers(stats)
    return evaluate(policy, store, stats, CONFIG)


def test_every_gripper_has_its_errors_and_baselines_and_the_whole_is_their_mean(rig_report) -> None:
    report = rig_report["report"]["validation"]
    grippers = report["per_gripper"]
    assert set(grippers) == {"robot0", "robot1"}
    for name in ("policy", *(b for b in BASELINES if b in report)):
        for c in COMPONENTS:
            whole = report[name][c]["executed"]["mean"]
            assert whole == pytest.approx(
                np.mean([g[name][c]["executed"]["mean"] for g in grippers.values()])
            )
    for gripper in grippers.values():
        assert gripper["best_baseline"]["position_mm"] in BASELINES
        assert set(gripper["camera_ablation_gap_position_mm"]) >= {
            "constant_image",
            "camera1",
            f"camera{SCENE}",
        }
    # The grippers move differently: their baselines' errors are their own.
    assert grippers["robot0"]["mean_motion"] != grippers["robot1"]["mean_motion"]


def test_each_grippers_baselines_continue_its_own_motion(rig_report, rig_stats) -> None:  # noqa: F811
    store, stats_path = rig_stats
    samples = rig_report["samples"]
    chunks = rig_report["chunks"]
    assert chunks["hold_still"].shape[-1] == 20 and np.array_equal(
        chunks["hold_still"][..., 10:], hold_still(len(samples), WINDOW.horizon)
    )
    obs_pose, obs_width = (
        samples.batch["obs_pose"].double().numpy(),
        samples.batch["obs_width"].double().numpy(),
    )
    stats = json.loads(stats_path.read_text())
    width = stats["lowdim"]["obs.gripper_width"]
    gripper1 = constant_velocity(
        obs_pose[..., 9:18], obs_width[..., 1:2], WINDOW.horizon, (width["min"][1], width["max"][1])
    )
    np.testing.assert_array_equal(chunks["constant_velocity"][..., 10:], gripper1)
    # Gripper 1's errors are those of its own ten numbers.
    recorded = samples.batch["action"].double().numpy()
    errors = chunk_errors(chunks["constant_velocity"][..., 10:], recorded[..., 10:])
    executed = errors["position_mm"][:, : WINDOW.n_action_steps].mean(axis=1).mean()
    report = rig_report["report"]["validation"]["per_gripper"]["robot1"]
    assert report["constant_velocity"]["position_mm"]["executed"]["mean"] == pytest.approx(executed)
    assert len(collect_samples(store, stats["split"]["val"], WINDOW, CONFIG.stride)) == len(samples)


def test_every_camera_is_ablated_alone_and_an_absent_camera_is_one_of_its_ablations(rig_report) -> None:
    report = rig_report["report"]["validation"]
    gaps = report["camera_ablation_gap_position_mm"]
    assert {"constant_image"} <= set(gaps)
    for k in (1, SCENE):
        assert set(gaps[f"camera{k}"]) >= {"constant_image", "absent"}
        for entry in gaps[f"camera{k}"].values():
            assert entry["ci95_low"] <= entry["mean"] <= entry["ci95_high"]
    chunks = rig_report["chunks"]
    # Each ablation changes the policy's input, so its chunks: the cameras are all read.
    for name in (
        "camera_ablation_constant_image",
        "camera_ablation_absent_camera1",
        f"camera_ablation_absent_camera{SCENE}",
    ):
        assert not np.array_equal(chunks[name], chunks["policy"]), name
    assert report["spread_mm"] == pytest.approx(
        np.mean([g["spread_mm"] for g in report["per_gripper"].values()])
    )
