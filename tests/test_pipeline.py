"""End to end: the real `dvc repro` on a copy of this repository and a generated export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | GIT_ENV | {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "DVC_NO_ANALYTICS": "1"}


def run(cwd: Path, *args: str) -> str:
    done = subprocess.run(args, cwd=cwd, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def checkout_copy(dest: Path) -> Path:
    """This working tree's files (tracked and untracked, not ignored) in a fresh git repository."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO_ROOT / rel
        if src.is_file() and not rel.startswith("data/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    run(dest, "git", "init", "-q", "-b", "main")
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-q", "-m", "copy")
    return dest


def shorten_training(repo: Path) -> None:
    """The demo's params, with a training run of a few steps: the stage runs for real, quickly."""
    import yaml

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"] |= {"steps": 6, "batch_size": 8, "val_every": 3, "val_batches": 1, "checkpoint_every": 3, "num_workers": 0}
    params["eval"] |= {"stride": 16, "spread_observations": 2, "spread_samples": 3}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "git", "commit", "-qam", "short training")


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory) -> Path:
    repo = checkout_copy(tmp_path_factory.mktemp("checkout"))
    shorten_training(repo)
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "3", "--seed", "7")
    run(repo, "dvc", "repro")
    return repo


def test_repro_pairs_the_sample_export_and_reports_every_defect(demo_repo: Path) -> None:
    manifest = json.loads((demo_repo / "data/manifest.json").read_text())
    metrics = json.loads((demo_repo / "metrics/pair.json").read_text())
    report = json.loads((demo_repo / "metrics/pair_report.json").read_text())

    assert metrics["recordings_accepted"] == len(manifest["recordings"]) == 3
    exported = {p.relative_to(demo_repo / "data/raw").as_posix() for p in (demo_repo / "data/raw").rglob("*") if p.is_file()}
    in_manifest = {f["path"] for r in manifest["recordings"] for f in r["files"].values()}
    rejected = {r["path"] for r in report["rejected_files"]}
    assert in_manifest | rejected == exported and not in_manifest & rejected  # every file accounted for, once


def test_provenance_of_pair_holds_code_environment_machine_and_hashes(demo_repo: Path) -> None:
    prov = json.loads((demo_repo / "metrics/provenance/pair.json").read_text())
    head = run(demo_repo, "git", "rev-parse", "HEAD").strip()
    assert prov["git"]["commit"] == head and prov["git"]["branch"] == "main"
    assert prov["git"]["dirty"] is True  # the run's own outputs are not committed yet
    assert prov["environment"]["lock"]["sha256"] and prov["environment"]["installed"]["dvc"]
    assert prov["accelerator"]["device"] in ("cpu", "cuda")
    assert prov["host"]["cpu_count"] >= 1
    assert "stages/pair.py" in prov["command"]
    assert prov["params"] == {"task": "pick_place", "accept_truncated": False, "hash_workers": 0}
    assert set(prov["inputs_sha256"]) == {"data/raw"}
    assert set(prov["outputs_sha256"]) == {"data/manifest.json", "metrics/pair_report.json", "metrics/pair.json"}
    assert prov["duration_s"] >= 0


def test_dataset_report_stats_and_verify_after_repro(demo_repo: Path) -> None:
    report = json.loads((demo_repo / "metrics/dataset.json").read_text())
    stats = json.loads((demo_repo / "data/stats/stats.json").read_text())
    assert report["episodes"] == 3 and report["train_episodes"] + report["val_episodes"] == 3
    assert report["fingerprint"] == stats["dataset_fingerprint"]["sha256"]
    assert set(stats["lowdim"]) == {"action", "obs.eef_pose_rel", "obs.gripper_width"}
    assert len(stats["lowdim"]["action"]["mean"]) == 10
    assert {p.name for p in (demo_repo / "metrics/plots/dataset").iterdir()} == {
        "episode_lengths.png", "paths_topdown.png", "gripper_width.png", "contact_sheet.png"
    }
    out = run(demo_repo, "policypipe", "verify", "data/dataset.zarr")
    assert out.startswith("OK data/dataset.zarr")
    for stage in ("pair", "convert", "stats", "train", "eval"):
        assert json.loads((demo_repo / f"metrics/provenance/{stage}.json").read_text())["stage"] == stage


def test_second_repro_changes_nothing(demo_repo: Path) -> None:
    watched = [
        "data/manifest.json", "metrics/pair.json", "metrics/pair_report.json", "metrics/provenance/pair.json", "dvc.lock",
        "metrics/convert.json", "metrics/dataset.json", "data/stats/stats.json", "metrics/provenance/stats.json",
        "metrics/train.json", "data/policy/model.safetensors", "metrics/provenance/train.json",
        "metrics/eval.json", "metrics/eval_per_step.json", "metrics/provenance/eval.json",
    ]
    before = {p: (demo_repo / p).read_bytes() for p in watched}
    out = run(demo_repo, "dvc", "repro")
    assert "didn't change" in out or "up to date" in out
    assert {p: (demo_repo / p).read_bytes() for p in watched} == before
    assert "Running stage" not in out


def test_train_stage_exports_a_policy_with_checkpoints_and_metrics(demo_repo: Path) -> None:
    metrics = json.loads((demo_repo / "metrics/train.json").read_text())
    assert metrics["steps"] == 6 and metrics["val_loss_first"] > 0 and metrics["samples_per_s"] > 0
    checkpoints = {p.name for p in (demo_repo / "data/train/checkpoints").iterdir()}
    assert "latest" in checkpoints and any(n.startswith("val_loss-") for n in checkpoints)
    assert run(demo_repo, "policypipe", "verify", "data/policy").startswith("OK")
    assert (demo_repo / "metrics/train/plots/metrics/train/train_loss.tsv").is_file()
    assert (demo_repo / "data/train/log.jsonl").read_text().count("\n") == 6


def test_eval_stage_reports_errors_baselines_and_plots(demo_repo: Path) -> None:
    report = json.loads((demo_repo / "metrics/eval.json").read_text())
    assert report["samples"] > 0 and report["skipped_episodes"] == 0
    assert set(report["ratio_to_hold_still"]) == {"position_mm", "rotation_deg", "width_mm"}
    per_step = json.loads((demo_repo / "metrics/eval_per_step.json").read_text())
    assert [row["step"] for row in per_step] == list(range(1, 17))
    assert {p.name for p in (demo_repo / "metrics/plots/eval").iterdir()} == {"predicted_vs_recorded.png", "error_vs_horizon.png"}
    shown = run(demo_repo, "dvc", "metrics", "show")
    assert "metrics/eval.json" in shown


def test_manifest_is_identical_in_another_checkout_location(demo_repo: Path, tmp_path: Path) -> None:
    other = checkout_copy(tmp_path / "somewhere" / "else")
    shorten_training(other)
    shutil.copytree(demo_repo / "data/raw", other / "data/raw")
    run(other, "dvc", "repro")
    for output in ("data/manifest.json", "data/stats/stats.json", "metrics/dataset.json", "data/policy/model.safetensors",
                   "metrics/eval.json"):
        assert (other / output).read_bytes() == (demo_repo / output).read_bytes(), output
