"""The serving benchmark of `make bench` runs: it broke once unseen when the runtime spec changed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_make_bench_serve_measures_the_server_against_the_runner_in_process(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench_serve", "--calls", "2", "--threads", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for line in ("act in process", "act through the server", "added by the server", "served / in process"):
        assert line in done.stdout
