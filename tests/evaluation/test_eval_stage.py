"""The `eval` stage script on a tiny store: it reports, or it fails; it never turns a bug into a report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from tests.dataset.conftest import make_store
from tests.training.conftest import MODEL

STAGES = Path(__file__).resolve().parents[2] / "stages"


@pytest.fixture
def stage(tmp_path: Path, monkeypatch):
    """The stage's main(), run in tmp_path with a tiny store, statistics, policy and params.yaml."""
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40, 35, 28, 33, 31, 29, 32))
    stats = compute_statistics(
        zarr.open_group(tmp_path / "ds.zarr", mode="r"),
        WindowConfig(2, 8, 4),
        StatsConfig(val_fraction=0.4, test_fraction=0.3),
    )
    stats["dataset_fingerprint"] = {"sha256": "f" * 64}
    write_json_atomic(tmp_path / "stats.json", stats)
    torch.manual_seed(0)
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    save_policy(tmp_path / "policy", policy, {"stats_sha256": sha256_file(tmp_path / "stats.json")})
    (tmp_path / "params.yaml").write_text(
        "eval:\n  stride: 6\n  batch_size: 16\n  spread_samples: 2\n  spread_observations: 1\n"
        "  plot_episodes: 1\n  bootstrap_resamples: 200\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(STAGES))
    spec = importlib.util.spec_from_file_location("eval_stage", STAGES / "eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(
        module, "setup_logging", lambda: None
    )  # it reconfigures sys.stdout, which pytest captures
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "eval.py",
            "--policy",
            "policy",
            "--dataset",
            "ds.zarr",
            "--stats",
            "stats.json",
            "--metrics",
            "eval.json",
            "--per-step",
            "per_step.json",
            "--plots",
            "plots",
            "--provenance",
            "provenance.json",
        ],
    )
    return module.main


def test_the_stage_writes_the_report_with_the_best_baseline(stage, tmp_path: Path, capsys) -> None:
    stage()
    metrics = json.loads((tmp_path / "eval.json").read_text())
    assert metrics["headline"] == "test"
    out = capsys.readouterr().out
    for side, label in (("test", "headline"), ("validation", "chose the settings")):
        report = metrics[side]
        assert set(report["ratio_to_best_baseline"]) == {"position_mm", "rotation_deg", "width_mm"}
        line = next(line for line in out.splitlines() if line.startswith(f"{side} ({label}): "))
        assert (
            f"of {report['episodes']} episodes" in line
            and f"of the best baseline ({report['best_baseline']['position_mm']}" in line
            and "CIs cover episodes, then samples within them (one seed; " in line
        )
    # The nearest-neighbour baseline's cost: seconds, so in the provenance record, not the metrics.
    assert report["nearest_neighbour"]["position_mm"]["executed"]["mean"] > 0
    cost = json.loads((tmp_path / "provenance.json").read_text())["details"]["baseline_cost_s"]
    assert set(cost["nearest_neighbour"]) == {"build_s", "predict_s"}
    assert "nearest_neighbour: built in" in out


def test_a_policy_that_raises_fails_the_stage_and_writes_no_metrics(
    stage, tmp_path: Path, monkeypatch
) -> None:
    def broken(self, batch, generator=None):
        raise RuntimeError("shape mismatch in the denoiser")

    monkeypatch.setattr(DiffusionPolicy, "predict_action", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # a traceback and exit status 1 under dvc repro
        stage()
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "provenance.json").exists()


def test_statistics_other_than_the_policys_are_refused(stage, tmp_path: Path, capsys) -> None:
    # Another split's validation side may hold episodes the policy trained on: compare refused
    # them, eval did not.
    stats = json.loads((tmp_path / "stats.json").read_text())
    stats["split"]["train"], stats["split"]["val"] = stats["split"]["val"], stats["split"]["train"]
    write_json_atomic(tmp_path / "stats.json", stats)
    with pytest.raises(SystemExit) as exit_code:
        stage()
    assert exit_code.value.code == 2
    err = capsys.readouterr().err
    assert "was trained with statistics sha256" in err and "not with stats.json" in err
    assert not (tmp_path / "eval.json").exists()
