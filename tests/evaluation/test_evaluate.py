"""evaluate and compare on a tiny real store with a tiny policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from policypipe.atomic import canonical_json
from policypipe.dataset import layout
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig, episode_bounds
from policypipe.evaluation.evaluate import (
    Baselines,
    EvalConfig,
    compare_policies,
    comparison_table,
    evaluate,
    moving_vs_still,
    verdict,
)
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.diffusion import DiffusionPolicy
from tests.dataset.conftest import make_store
from tests.training.conftest import MODEL

CONFIG = EvalConfig(stride=5, batch_size=16, spread_samples=3, spread_observations=2)
SPLIT = StatsConfig(val_fraction=0.4, test_fraction=0.3)


def store_stats_policy(folder: Path):
    # 3 training, 4 validation and 2 test episodes.
    make_store(folder / "ds.zarr", lengths=(30, 25, 40, 35, 28, 33, 31, 29, 32))
    root = zarr.open_group(folder / "ds.zarr", mode="r")
    stats = compute_statistics(root, WindowConfig(2, 8, 4), SPLIT)
    torch.manual_seed(0)
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    return folder / "ds.zarr", stats, policy.eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The store, its statistics and the policy, shared by the module's tests: read-only."""
    return store_stats_policy(tmp_path_factory.mktemp("eval"))


@pytest.fixture(scope="module")
def evaluated(setup):
    """evaluate's result on `setup`, computed once: what most tests read."""
    store, stats, policy = setup
    return evaluate(policy, store, stats, CONFIG)


ENTRIES = (
    "policy",
    "hold_still",
    "mean_motion",
    "constant_velocity",
    "nearest_neighbour",
    "camera_ablation_other_episodes",
    "camera_ablation_constant_image",
)
COMPONENTS = ("position_mm", "rotation_deg", "width_mm")
BASELINE_NAMES = ("hold_still", "mean_motion", "constant_velocity", "nearest_neighbour")


def test_report_has_errors_baselines_ratios_ablations_and_spread(evaluated) -> None:
    result = evaluated
    report = result["report"]["test"]
    assert report["samples"] > 0 and report["skipped_episodes"] == 0 and report["omitted"] == {}
    for name in ENTRIES:
        for component in COMPONENTS:
            summary = report[name][component]
            assert set(summary) == {"executed", "horizon"} and set(summary["executed"]) == {
                "mean",
                "median",
                "p90",
            }
    for baseline in BASELINE_NAMES:
        ratio = report[f"ratio_to_{baseline}"]["position_mm"]
        assert ratio == pytest.approx(means_of(report, "policy") / means_of(report, baseline))
    assert set(result["per_step"][0]) == {"step", *ENTRIES}
    assert report["spread_mm"] > 0  # different noise, different chunks


def test_the_test_side_is_the_headline_and_validation_is_reported_beside_it(setup, evaluated) -> None:
    store, stats, policy = setup
    result = evaluated
    report = result["report"]
    assert report["headline"] == "test" and "no_test_side" not in report
    split = stats["split"]
    for side, episodes in (("test", split["test"]), ("validation", split["val"])):
        assert report[side]["episodes"] == len(episodes) >= 2
    # The plots' samples are the headline's: test episodes only, none trained on or chosen on.
    assert set(result["samples"].episodes.tolist()) == set(split["test"])
    assert report["test"]["policy"] != report["validation"]["policy"]
    # What compare measures on each side is what eval reports there.
    for side in ("test", "validation"):
        alone = compare_policies([policy], None, store, stats, CONFIG, held_out=side)
        assert alone["held_out"] == side and alone["episodes"] == report[side]["episodes"]
        assert alone["sides"]["A"]["components"]["position_mm"]["policy"]["mean"] == pytest.approx(
            report[side]["policy"]["position_mm"]["executed"]["mean"]
        )


def test_without_a_test_side_validation_is_the_headline_and_says_so(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40, 35, 28))
    root = zarr.open_group(tmp_path / "ds.zarr", mode="r")
    stats = compute_statistics(root, WindowConfig(2, 8, 4), StatsConfig(val_fraction=0.4, test_fraction=0))
    torch.manual_seed(0)
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    report = evaluate(policy.eval(), tmp_path / "ds.zarr", stats, CONFIG)["report"]
    assert report["headline"] == "validation" and "test" not in report
    assert "optimistic" in report["no_test_side"]
    with pytest.raises(ValueError, match="no test side"):
        compare_policies([policy], None, tmp_path / "ds.zarr", stats, CONFIG, held_out="test")


def test_statistics_without_a_test_side_are_refused_with_the_fix(setup) -> None:
    store, stats, policy = setup
    old = stats | {"split": {k: v for k, v in stats["split"].items() if k != "test"}}
    with pytest.raises(ValueError, match="rerun `dvc repro stats`"):
        evaluate(policy, store, old, CONFIG)


def test_every_component_has_a_ratio_to_its_best_baseline(evaluated) -> None:
    report = evaluated["report"]["test"]
    for c in COMPONENTS:
        means = {b: report[b][c]["executed"]["mean"] for b in BASELINE_NAMES}
        best = min(means, key=means.get)
        assert report["best_baseline"][c] == best
        assert report["ratio_to_best_baseline"][c] == pytest.approx(
            report["policy"][c]["executed"]["mean"] / means[best]
        )
        ci = report["ratio_to_best_baseline_ci95"][c]
        assert ci["ci95_low"] <= report["ratio_to_best_baseline"][c] <= ci["ci95_high"]
    assert (
        report["ci_covers"] == f"episodes, then samples within them (one seed; {report['episodes']} episodes)"
    )
    assert report["ci_method"].startswith("percentile bootstrap over seeds, then episodes, then samples")
    for c in COMPONENTS:
        ci = report["policy_executed_ci95"][c]
        assert ci["ci95_low"] <= report["policy"][c]["executed"]["mean"] <= ci["ci95_high"]
    # The tiny store's motion is smooth: continuing it beats holding still on position.
    assert means_of(report, "constant_velocity") < means_of(report, "hold_still")


def means_of(report: dict, name: str) -> float:
    return report[name]["position_mm"]["executed"]["mean"]


def test_the_camera_ablations_and_their_gaps(evaluated) -> None:
    report = evaluated["report"]["test"]
    for name, key in (
        ("camera_ablation_other_episodes", "other_episodes"),
        ("camera_ablation_constant_image", "constant_image"),
    ):
        gap = report["camera_ablation_gap_position_mm"][key]
        assert gap["mean"] == pytest.approx(means_of(report, name) - means_of(report, "policy"))
        assert gap["ci95_low"] <= gap["mean"] <= gap["ci95_high"]
    # Another episode's frames are not a constant image: the two ablations predict differently.
    assert means_of(report, "camera_ablation_other_episodes") != means_of(
        report, "camera_ablation_constant_image"
    )


def test_ablation_feeds_frames_of_another_episode_and_the_sample_own_poses(setup, monkeypatch) -> None:
    store, stats, policy = setup
    seen = []
    original = DiffusionPolicy.predict_action

    def spy(self, batch, generator=None):
        seen.append({k: v.clone() for k, v in batch.items()})
        return original(self, batch, generator)

    monkeypatch.setattr(DiffusionPolicy, "predict_action", spy)
    result = evaluate(policy, store, stats, CONFIG)
    samples = result["samples"]
    n = len(samples)
    batches = -(-n // CONFIG.batch_size)
    # The policy's own predictions come first, then the ablation with other episodes' frames.
    own, ablated = seen[:batches], seen[batches : 2 * batches]
    own_images, ablated_images = (torch.cat([b["obs_images"] for b in calls]) for calls in (own, ablated))
    own_pose, ablated_pose = (torch.cat([b["obs_pose"] for b in calls]) for calls in (own, ablated))
    assert torch.equal(own_images, samples.batch["obs_images"]) and torch.equal(ablated_pose, own_pose)
    # Each sample's frames are those of a sample of another episode.
    flat = samples.batch["obs_images"].reshape(n, -1)
    for i in range(n):
        source = [j for j in range(n) if torch.equal(flat[j], ablated_images[i].reshape(-1))]
        assert source and all(samples.episodes[j] != samples.episodes[i] for j in source)


def test_with_one_observation_step_the_baselines_still_read_the_recorded_motion(tmp_path: Path) -> None:
    """A policy of one observation step sees no motion; constant velocity and the nearest neighbour
    read the recording's last two steps all the same: on the same anchors, the same chunks as
    beside a policy of two."""
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40, 35, 28, 33))
    root = zarr.open_group(tmp_path / "ds.zarr", mode="r")
    one, two = WindowConfig(1, 8, 4), WindowConfig(2, 8, 4)
    stats = compute_statistics(root, one, SPLIT)
    episodes = stats["split"]["test"] + stats["split"]["val"]
    chunks = {}
    for window in (one, two):
        samples = collect_samples(tmp_path / "ds.zarr", episodes, window, CONFIG.stride)
        chunks[window], _ = Baselines.build(tmp_path / "ds.zarr", stats, window, CONFIG).chunks(samples)
    assert samples.batch["obs_pose"].shape[1] == 2  # the last window's samples: two steps
    for name in ("constant_velocity", "nearest_neighbour"):
        np.testing.assert_allclose(chunks[one][name], chunks[two][name], atol=1e-5)
    # The recorded motion is a motion: constant velocity does not hold still.
    assert np.abs(chunks[one]["constant_velocity"] - chunks[one]["hold_still"]).max() > 1e-3

    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(MODEL, n_obs_steps=1))
    policy.fit_normalizers(stats)
    report = evaluate(policy, tmp_path / "ds.zarr", stats, CONFIG)["report"]["test"]
    assert (
        "constant_velocity" not in report["omitted"]
        and report["constant_velocity"]["position_mm"]["executed"]["mean"] > 0
    )


def test_a_policy_that_raises_fails_the_evaluation(setup, monkeypatch) -> None:
    """Only unreadable data is skipped: a bug in the policy must not become a smaller report."""
    store, stats, policy = setup

    def broken(self, batch, generator=None):
        raise RuntimeError("shape mismatch in the denoiser")

    monkeypatch.setattr(DiffusionPolicy, "predict_action", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        evaluate(policy, store, stats, CONFIG)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        compare_policies([policy], None, store, stats, CONFIG)


def test_report_is_deterministic(setup, evaluated) -> None:
    store, stats, policy = setup
    first = evaluated
    again = evaluate(policy, store, stats, CONFIG)
    assert canonical_json(first["report"]) == canonical_json(again["report"])
    assert canonical_json(first["per_step"]) == canonical_json(again["per_step"])


def test_a_broken_episode_is_skipped_and_counted(tmp_path: Path) -> None:
    store, stats, policy = store_stats_policy(tmp_path)  # a store of its own: the test damages it
    root = zarr.open_group(store, mode="r")
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    val = stats["split"]["val"]
    # Remove the shard holding a validation episode's first frame (its first sample observes it):
    # that episode cannot be read; a neighbour sharing the shard may not be readable either.
    victim = val[-1]
    shard_index = first[victim] // 10
    (store / "data" / "camera0_rgb" / "c" / str(shard_index) / "0" / "0" / "0").unlink()
    sharing = {e for e in val if first[e] // 10 <= shard_index <= last[e] // 10}

    report = evaluate(policy, store, stats, CONFIG)["report"]["validation"]

    skipped = {s["episode"] for s in report["skipped"]}
    assert victim in skipped and skipped <= sharing
    assert report["skipped_episodes"] == len(skipped)
    assert report["episodes"] == len(val) - len(skipped)
    assert all(s["reason"].startswith("UnreadableFrame") for s in report["skipped"])


def test_compare_a_policy_with_itself_gives_zero_with_a_ci_around_zero(setup) -> None:
    store, stats, policy = setup
    comparison = compare_policies([policy], [policy], store, stats, CONFIG)
    for component in COMPONENTS:
        c = comparison["b_minus_a"][component]
        assert c["mean"] == 0 and c["ci95"][0] <= 0 <= c["ci95"][1]
    episodes = comparison["episodes"]
    assert comparison["b_minus_a_ci_covers"] == (
        f"episodes, then samples within them (one seed per side; {episodes} episodes)"
    )
    assert "then episodes, then samples within the drawn episodes" in comparison["ci_method"]
    assert verdict("position_mm", comparison["b_minus_a"]["position_mm"]).startswith(
        "no clear difference on position"
    )


def test_a_policy_that_remembers_its_start_is_evaluated_and_compared_on_its_episodes_first_frames(
    tmp_path: Path,
) -> None:
    # Episodes long enough for a grasp and a release each (the memory is the event head's).
    store = tmp_path / "ds.zarr"
    make_store(store, lengths=(150, 130, 160, 140, 135, 155, 145))
    stats = compute_statistics(zarr.open_group(store, mode="r"), WindowConfig(2, 8, 4), SPLIT)
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(MODEL, event_loss_weight=1.0, remember_release=True))
    policy.fit_normalizers(stats)
    policy.eval()
    samples = collect_samples(store, stats["split"]["test"], WindowConfig(2, 8, 4), CONFIG.stride, True)
    assert samples.batch["start_image"].shape[1:] == samples.batch["obs_images"].shape[2:]
    report = evaluate(policy, store, stats, CONFIG)["report"]["test"]
    assert np.isfinite(report["policy"]["position_mm"]["executed"]["mean"])
    comparison = compare_policies([policy], [policy], store, stats, CONFIG)
    assert comparison["b_minus_a"]["position_mm"]["mean"] == 0
    # Against a policy without a memory, on either side: both read the same samples.
    plain = DiffusionPolicy(replace(MODEL, event_loss_weight=1.0))
    plain.fit_normalizers(stats)
    comparison = compare_policies([plain.eval()], [policy], store, stats, CONFIG)
    assert np.isfinite(comparison["b_minus_a"]["position_mm"]["mean"])


def test_compare_one_side_of_seeds_against_the_baselines(setup, evaluated) -> None:
    store, stats, policy = setup
    torch.manual_seed(1)
    other_seed = DiffusionPolicy(MODEL)
    other_seed.fit_normalizers(stats)
    alone = compare_policies([policy], None, store, stats, CONFIG)
    seeds = compare_policies([policy, other_seed.eval()], None, store, stats, CONFIG)
    episodes = alone["episodes"]
    assert "b_minus_a" not in seeds
    assert (
        alone["sides"]["A"]["ci_covers"]
        == f"episodes, then samples within them (one seed; {episodes} episodes)"
    )
    side = seeds["sides"]["A"]
    assert side["seeds"] == 2
    assert side["ci_covers"] == f"seeds, episodes, then samples within them (A: 2 seeds; {episodes} episodes)"
    report = evaluated["report"]["validation"]
    for c in COMPONENTS:
        entry = side["components"][c]
        assert set(entry) == {
            "policy",
            "baselines",
            "best_baseline",
            "ratio_to_best_baseline",
            "camera_ablation_gap",
        }
        assert set(entry["baselines"]) == set(BASELINE_NAMES)
        # One seed alone: the same numbers as the eval stage's.
        one = alone["sides"]["A"]["components"][c]
        assert one["policy"]["mean"] == pytest.approx(report["policy"][c]["executed"]["mean"])
        assert one["best_baseline"] == report["best_baseline"][c]
        assert one["ratio_to_best_baseline"]["mean"] == pytest.approx(report["ratio_to_best_baseline"][c])
        for b, value in entry["baselines"].items():
            assert value["mean"] == pytest.approx(report[b][c]["executed"]["mean"])
    assert comparison_table(seeds)[0].startswith(f"{seeds['samples']} samples")


def test_compare_refuses_seeds_of_different_configurations(setup) -> None:
    store, stats, policy = setup
    other = DiffusionPolicy(replace(MODEL, num_inference_steps=2))
    other.fit_normalizers(stats)
    with pytest.raises(ValueError, match="side A have different configurations"):
        compare_policies([policy, other], None, store, stats, CONFIG)


def test_moving_and_still_samples_are_summarised_apart() -> None:
    # 4 episodes; the gripper is still in the first 6 samples, where holding still is nearly exact,
    # and moves in the last 6, where continuing the motion is the best baseline.
    episodes = np.array([0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    still = np.arange(12) < 6
    errors = {
        "policy": np.where(still, 1.0, 3.0),
        "hold_still": np.where(still, 0.5, 10.0),
        "constant_velocity": np.where(still, 2.0, 6.0),
    }
    executed = {name: {"width_mm": e} for name, e in errors.items()}
    out = moving_vs_still(executed, {"width_mm": ~still}, episodes, EvalConfig(moving_width_mm=1.5))
    width = out["width_mm"]
    assert "1.5 mm" in width["rule"]
    assert width["still"] | {"ratio_to_best_baseline_ci95": None} == {
        "samples": 6,
        "episodes": 3,
        "policy": 1.0,
        "baselines": {"hold_still": 0.5, "constant_velocity": 2.0},
        "best_baseline": "hold_still",
        "ratio_to_best_baseline": 2.0,
        "ratio_to_best_baseline_ci95": None,
    }
    moving = width["moving"]
    assert (moving["samples"], moving["episodes"], moving["best_baseline"]) == (6, 2, "constant_velocity")
    assert moving["ratio_to_best_baseline"] == pytest.approx(0.5)
    assert moving["ratio_to_best_baseline_ci95"] == pytest.approx({"ci95_low": 0.5, "ci95_high": 0.5})


def test_no_still_sample_gives_counts_only() -> None:
    executed = {"policy": {"width_mm": np.ones(4)}, "hold_still": {"width_mm": np.ones(4)}}
    out = moving_vs_still(executed, {"width_mm": np.ones(4, dtype=bool)}, np.array([0, 0, 1, 1]), CONFIG)
    assert out["width_mm"]["still"] == {"samples": 0, "episodes": 0}


def test_report_splits_position_and_width_into_moving_and_still(setup, evaluated) -> None:
    store, stats, policy = setup
    report = evaluated["report"]["test"]
    for c in ("position_mm", "width_mm"):
        split = report["moving_vs_still"][c]
        assert split["moving"]["samples"] + split["still"]["samples"] == report["samples"]
        assert set(split) == {"rule", "moving", "still"}
    # Everything counts as still above any motion: the split then repeats the headline.
    everything_still = replace(CONFIG, moving_position_mm=1e9, moving_width_mm=1e9)
    split = evaluate(policy, store, stats, everything_still)["report"]["test"]["moving_vs_still"][
        "position_mm"
    ]
    assert split["moving"] == {"samples": 0, "episodes": 0}
    assert split["still"]["episodes"] == report["episodes"]
    assert split["still"]["policy"] == pytest.approx(report["policy"]["position_mm"]["executed"]["mean"])
    assert split["still"]["ratio_to_best_baseline"] == pytest.approx(
        report["ratio_to_best_baseline"]["position_mm"]
    )
