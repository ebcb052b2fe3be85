"""A real one-node Slurm cluster (tests/slurm.py) and a checkout with sample recordings, paired."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.slurm import LoopbackSlurm, ensure_slurm, start_slurm
from tests.workspace import checkout_copy, run


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> LoopbackSlurm:
    problem = ensure_slurm()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)  # CI runs as root and can install it: a skip there would hide the tests
        pytest.skip(problem)
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the client commands of the tests and of the stages they run
    yield cluster
    cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


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


@pytest.fixture(scope="module")
def paired_repo(tmp_path_factory) -> Path:
    """A checkout with 4 sample recordings in data/raw (tracked by DVC), paired by `dvc repro pair`."""
    repo = checkout_copy(tmp_path_factory.mktemp("checkout"))
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "4", "--seed", "3")
    run(repo, "dvc", "add", "--quiet", "data/raw")
    run(repo, "dvc", "repro", "pair")
    return repo
