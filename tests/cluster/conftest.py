"""A real one-node Slurm cluster (tests/slurm.py) and a checkout with sample recordings, paired."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_installed
from tests.slurm import LoopbackSlurm, ensure_slurm, start_slurm
from tests.workspace import checkout_copy, run


def sbatch_default_logs(folders: list[Path]) -> set[Path]:
    """sbatch's own `slurm-<id>.out`, which a job writes into the folder it was submitted from when
    it is given no --output: in these folders, and anywhere below the tests' temporary folders."""
    return {p for folder in folders for p in folder.glob("slurm-*.out")} | set(
        folders[-1].rglob("slurm-*.out")
    )


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> LoopbackSlurm:
    require_installed(ensure_slurm())
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    # The client commands of the tests and of the stages they run.
    os.environ["SLURM_CONF"] = str(cluster.conf)
    # Every job's log goes to its run's own (git-ignored) folder, never to where it was submitted
    # from: a test's checkout, or the repository the tests run in (a slurm-3.out was once committed).
    watched = [Path.cwd(), Path(__file__).parents[2], tmp_path_factory.getbasetemp()]
    before = sbatch_default_logs(watched)
    yield cluster
    cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    stray = sbatch_default_logs(watched) - before
    assert not stray, f"Slurm jobs wrote logs outside their run folders: {sorted(map(str, stray))}"


def set_params(repo: Path, section: str, **values) -> None:
    """params.yaml's `section` updated with `values` (nested mappings merged), as `dvc exp run -S` would."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    target = params[section]
    for key, value in values.items():
        if isinstance(value, dict):
            target[key] = (target.get(key) or {}) | value
        else:
            target[key] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def sampled_checkout(folder: Path, recordings: int, seed: int, until_stage: str) -> Path:
    """A checkout with sample recordings in data/raw (tracked by DVC), `dvc repro until_stage` run."""
    repo = checkout_copy(folder)
    run(repo, "policypipe", "sample", "data/raw", "--recordings", str(recordings), "--seed", str(seed))
    run(repo, "dvc", "add", "--quiet", "data/raw")
    run(repo, "dvc", "repro", until_stage)
    return repo


@pytest.fixture(scope="module")
def paired_repo(tmp_path_factory) -> Path:
    """4 sample recordings, paired."""
    return sampled_checkout(tmp_path_factory.mktemp("checkout"), 4, 3, "pair")


def as_in_a_terminal() -> None:
    """For Popen's preexec_fn: Ctrl-C's SIGINT as a terminal delivers it. A test run in the
    background (CI, nohup) starts with SIGINT ignored, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
