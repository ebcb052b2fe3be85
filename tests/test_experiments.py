"""Experiments on the pipeline: a queued two-point sweep in a temporary clone, compared with
`dvc exp show`, `dvc metrics diff` and `dvc plots diff`, as docs/evaluation.md, "Experiments", shows users."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.workspace import env, run

pytestmark = pytest.mark.slow


def wait_for_queue(repo: Path, timeout_s: float = 900) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = run(repo, "dvc", "queue", "status")
        if not any(state in status for state in ("Queued", "Running")):
            return status
        time.sleep(3)
    raise AssertionError(f"the queue did not finish in {timeout_s} s:\n{status}")


def test_a_queued_two_point_sweep_runs_and_compares(pipeline_repo: Path, tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    run(pipeline_repo, "dvc", "remote", "add", "--local", "sweep-storage", str(storage))
    run(pipeline_repo, "dvc", "push", "-r", "sweep-storage")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(pipeline_repo), str(clone)], check=True)
    run(clone, "dvc", "remote", "add", "--local", "--default", "storage", str(storage))
    run(clone, "dvc", "pull")

    run(clone, "dvc", "exp", "run", "--queue", "-S", "train.lr=1e-4,1e-3")
    try:
        run(clone, "dvc", "queue", "start", "-j", "2")
        status = wait_for_queue(clone)
    finally:
        subprocess.run(["dvc", "queue", "stop"], cwd=clone, env=env(), capture_output=True)
    failed = [line.split()[1] for line in status.splitlines() if "Failed" in line]
    assert not failed, status + "".join(run(clone, "dvc", "queue", "logs", name) for name in failed)

    rows = json.loads(run(clone, "dvc", "exp", "show", "--json", "--no-fetch"))
    experiments = {}
    for baseline in rows:
        for exp in baseline.get("experiments") or []:
            data = exp["revs"][0]["data"]
            lr = data["params"]["params.yaml"]["data"]["train"]["lr"]
            experiments[exp["name"]] = (lr, data["metrics"]["metrics/eval.json"]["data"])
    assert sorted(lr for lr, _ in experiments.values()) == [1e-4, 1e-3]
    for _, metrics in experiments.values():
        test = metrics[metrics["headline"]]
        assert metrics["headline"] == "test" and test["samples"] > 0
        assert test["policy"]["position_mm"]["executed"]["mean"] > 0

    first, second = sorted(experiments)
    diff = run(clone, "dvc", "metrics", "diff", first, second, "--json")
    changed = json.loads(diff)
    assert "metrics/eval.json" in changed and "metrics/train.json" in changed
    run(clone, "dvc", "plots", "diff", first, second, "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "index.html").is_file()
