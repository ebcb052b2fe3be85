"""`policypipe lineage` on a real pipeline run: from policy, checkpoint or dataset to the recordings."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from policypipe.lineage.provenance import cpu_model
from tests.workspace import env, run

pytestmark = pytest.mark.slow


def lineage(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["policypipe", "lineage", *args], cwd=repo, env=env(), capture_output=True, text=True
    )


def recording_lines(repo: Path) -> list[str]:
    manifest = json.loads((repo / "data/manifest.json").read_text())
    return [f"{f['sha256']}  {f['path']}" for r in manifest["recordings"] for f in r["files"].values()]


def test_policy_lineage_reaches_every_recording_with_commit_and_machine(pipeline_repo: Path) -> None:
    done = lineage(pipeline_repo, "data/policy")
    assert done.returncode == 0, done.stdout + done.stderr
    code_commit = (pipeline_repo.parent / "code_commit").read_text()
    stats = json.loads((pipeline_repo / "data/stats/stats.json").read_text())
    for stage in ("train", "stats", "convert", "pair"):
        line = next(line for line in done.stdout.splitlines() if line.startswith(f"<- {stage} run"))
        assert f"commit {code_commit[:12]}" in line and " on " in line
        assert f"(cpu: {cpu_model()})" in line  # which CPU: 2-core machines differ about 3x
    assert f"dataset fingerprint {stats['dataset_fingerprint']['sha256']}" in done.stdout
    assert len(recording_lines(pipeline_repo)) == 9
    for line in recording_lines(pipeline_repo):
        assert line in done.stdout
    assert "NOT FOUND" not in done.stdout


def test_checkpoint_and_dataset_lineage_and_json(pipeline_repo: Path) -> None:
    checkpoint = lineage(pipeline_repo, "data/train/checkpoints/latest", "--json")
    chain = json.loads(checkpoint.stdout)["chain"]
    assert [link["what"] for link in chain] == [
        "checkpoint",
        "train run",
        "statistics",
        "stats run",
        "dataset",
        "convert run",
        "manifest",
        "pair run",
        "recordings",
    ]
    assert chain[-1]["count"] == 3
    dataset = lineage(pipeline_repo, "data/dataset.zarr")
    assert dataset.returncode == 0 and all(line in dataset.stdout for line in recording_lines(pipeline_repo))


def test_an_older_run_is_found_in_git_history(pipeline_repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(pipeline_repo), str(clone)], check=True)
    shutil.copytree(pipeline_repo / "data/policy", clone / "data/policy")
    shutil.copy(pipeline_repo / "data/manifest.json", clone / "data/manifest.json")
    # A later run of train elsewhere replaced the record in the working tree.
    (clone / "metrics/provenance/train.json").write_text('{"stage": "train", "outputs_sha256": {}}')
    run(clone, "git", "commit", "-qam", "another train run")
    done = lineage(clone, "data/policy")
    old = run(clone, "git", "rev-parse", "HEAD~1").strip()
    assert done.returncode == 0 and f"[record from commit {old[:12]}" in done.stdout


def test_missing_links_and_wrong_paths_are_explained(pipeline_repo: Path, tmp_path: Path) -> None:
    stranger = tmp_path / "policy"
    shutil.copytree(pipeline_repo / "data/policy", stranger)
    (stranger / "config.json").write_text(
        (stranger / "config.json").read_text() + " "
    )  # another policy's bytes
    done = lineage(pipeline_repo, str(stranger))
    assert done.returncode == 1 and "train run: NOT FOUND" in done.stdout

    done = lineage(pipeline_repo, "params.yaml")
    assert done.returncode == 2 and "is not a policy export" in done.stderr
    done = lineage(pipeline_repo, "data/nothing")
    assert done.returncode == 2 and "dvc pull" in done.stderr
