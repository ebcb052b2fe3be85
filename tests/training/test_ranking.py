"""The executed-error probe that can rank checkpoints, and re-ranking a resumed run's top-k."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policypipe.dataset.window_dataset import WindowDataset
from policypipe.evaluation.errors import COMPONENTS, chunk_errors, hold_still
from policypipe.evaluation.evaluate import executed_errors, predict
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.checkpoint import TrainHistory
from policypipe.training.config import model_for_dataset
from policypipe.training.ranking import ExecutedErrorProbe
from tests.training.conftest import MODEL, WINDOW


@pytest.fixture
def probe_and_policy(dataset):
    store, stats_path = dataset
    stats = json.loads(stats_path.read_text())
    windows = WindowDataset(store, stats["split"]["val"], WINDOW)
    torch.manual_seed(0)
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    return windows, ExecutedErrorProbe.of(windows, 10, WINDOW.n_action_steps, seed=0), policy


def test_the_probe_measures_what_eval_reports_on_its_windows(probe_and_policy) -> None:
    windows, probe, policy = probe_and_policy
    # 10 windows evenly spaced over all validation windows, the first and the last included.
    assert len(probe.batch["action"]) == 10 and len(windows) > 10
    assert torch.equal(probe.batch["action"][-1], windows[len(windows) - 1]["action"])
    measured = probe.measure(policy, torch.device("cpu"))
    # eval's prediction with seed 0 draws the same noise (one batch: generator seed 0).
    chunks = predict(policy, probe.batch, batch_size=64, seed=0)
    recorded = probe.batch["action"].double().numpy()
    reported = executed_errors(chunks, recorded, WINDOW.n_action_steps)
    still = chunk_errors(hold_still(10, WINDOW.horizon), recorded)
    ratios = []
    for c in COMPONENTS:
        assert measured[c] == pytest.approx(reported[c].mean(), rel=1e-12)
        ratios.append(reported[c].mean() / still[c][:, : WINDOW.n_action_steps].mean())
    assert measured["score"] == pytest.approx(np.mean(ratios), rel=1e-12)


def test_measuring_leaves_the_runs_random_state_and_mode_alone(probe_and_policy) -> None:
    _, probe, policy = probe_and_policy
    policy.train()
    before = torch.get_rng_state()
    first = probe.measure(policy, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before) and policy.training
    assert probe.measure(policy, torch.device("cpu")) == first  # fixed windows, fixed noise


def test_a_resumed_run_with_another_ranking_reranks_its_kept_checkpoints() -> None:
    history = TrainHistory(
        val=[(250, 0.03), (500, 0.02), (750, 0.025)],
        executed=[(250, {"score": 0.9}), (500, {"score": 0.5}), (750, {"score": 0.4})],
        top_k=[(0.02, 500, "val_loss-0.02000-step-0000500"), (0.025, 750, "val_loss-0.02500-step-0000750")],
    )
    history.rerank("executed_error")
    assert history.rank_by == "executed_error"
    assert [(v, s) for v, s, _ in history.top_k] == [(0.4, 750), (0.5, 500)]
    # A checkpoint from before the executed error was recorded ranks last.
    old = TrainHistory(val=[(250, 0.03)], top_k=[(0.03, 250, "val_loss-0.03000-step-0000250")])
    old.rerank("executed_error")
    assert old.top_k[0][0] == float("inf")
    assert TrainHistory.from_json(json.loads(json.dumps(history.to_json()))) == history


def test_a_joint_space_probe_scores_the_arm_joints_and_the_grippers_against_holding_still(
    joint_dataset,
) -> None:
    store, stats_path = joint_dataset
    stats = json.loads(stats_path.read_text())
    windows = WindowDataset(store, stats["split"]["val"], WINDOW)
    probe = ExecutedErrorProbe.of(windows, 8, WINDOW.n_action_steps, seed=0)
    recorded = probe.batch["action"].double().numpy()
    current = probe.batch["obs_state"].double().numpy()[:, -1:]
    still = np.abs(recorded - current)[:, : WINDOW.n_action_steps]
    grippers = [6, 13]  # left_gripper, right_gripper
    arm = [d for d in range(14) if d not in grippers]
    assert probe.hold_still_error["joints"] == pytest.approx(still[..., arm].mean(), rel=1e-12)
    assert probe.hold_still_error["grippers"] == pytest.approx(still[..., grippers].mean(), rel=1e-12)
    torch.manual_seed(0)
    policy = DiffusionPolicy(model_for_dataset(MODEL, stats))
    policy.fit_normalizers(stats)
    measured = probe.measure(policy, torch.device("cpu"))
    ratios = [measured[c] / probe.hold_still_error[c] for c in ("joints", "grippers")]
    assert measured["score"] == pytest.approx(np.mean(ratios), rel=1e-12)
