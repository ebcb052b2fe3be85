"""evaluate and compare on a tiny real store with a tiny policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import zarr

from policypipe.atomic import canonical_json
from policypipe.dataset import layout
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig, episode_bounds
from policypipe.evaluation.evaluate import EvalConfig, compare_policies, evaluate, verdict
from policypipe.policy.diffusion import DiffusionPolicy
from tests.dataset.conftest import make_store
from tests.training.conftest import MODEL

CONFIG = EvalConfig(stride=5, batch_size=16, spread_samples=3, spread_observations=2)


@pytest.fixture
def setup(tmp_path: Path):
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40, 35, 28, 33, 31, 29))
    root = zarr.open_group(tmp_path / "ds.zarr", mode="r")
    stats = compute_statistics(root, WindowConfig(2, 8, 4), StatsConfig(val_fraction=0.4))
    torch.manual_seed(0)
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    return tmp_path / "ds.zarr", stats, policy.eval()


def test_report_has_errors_baselines_ratios_ablation_and_spread(setup) -> None:
    store, stats, policy = setup
    report = evaluate(policy, store, stats, CONFIG)["report"]
    assert report["samples"] > 0 and report["skipped_episodes"] == 0
    for name in ("policy", "hold_still", "mean_motion", "camera_ablation"):
        for component in ("position_mm", "rotation_deg", "width_mm"):
            summary = report[name][component]
            assert set(summary) == {"executed", "horizon"} and set(summary["executed"]) == {"mean", "median", "p90"}
    ratio = report["ratio_to_hold_still"]["position_mm"]
    assert ratio == pytest.approx(report["policy"]["position_mm"]["executed"]["mean"] / report["hold_still"]["position_mm"]["executed"]["mean"])
    assert report["spread_mm"] > 0  # different noise, different chunks


def test_report_is_deterministic(setup) -> None:
    store, stats, policy = setup
    first = evaluate(policy, store, stats, CONFIG)
    again = evaluate(policy, store, stats, CONFIG)
    assert canonical_json(first["report"]) == canonical_json(again["report"])
    assert canonical_json(first["per_step_position_mm"]) == canonical_json(again["per_step_position_mm"])


def test_a_broken_episode_is_skipped_and_counted(setup) -> None:
    store, stats, policy = setup
    root = zarr.open_group(store, mode="r")
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    val = stats["split"]["val"]
    # Remove the shard holding a validation episode's last frame: that episode cannot be read.
    victim = val[-1]
    shard = store / "data" / "camera0_rgb" / "c" / str(last[victim] // 10) / "0" / "0" / "0"
    shard.unlink()
    touched = {e for e in val if any(first[e] // 10 <= s <= last[e] // 10 for s in [last[victim] // 10])}

    report = evaluate(policy, store, stats, CONFIG)["report"]

    assert report["skipped_episodes"] == len(touched) >= 1
    assert report["episodes"] == len(val) - len(touched)
    assert all("FileNotFoundError" in s["reason"] for s in report["skipped"])


def test_compare_a_policy_with_itself_gives_zero_with_a_ci_around_zero(setup) -> None:
    store, stats, policy = setup
    comparison = compare_policies(policy, policy, store, stats, CONFIG)
    for component in ("position_mm", "rotation_deg", "width_mm"):
        c = comparison[component]
        assert c["b_minus_a"] == 0 and c["ci95"][0] <= 0 <= c["ci95"][1]
    assert verdict("position_mm", comparison["position_mm"]).startswith("no clear difference on position")
