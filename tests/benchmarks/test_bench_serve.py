"""The runtime benchmarks of `make bench` run: the serving one broke once unseen when the runtime
spec changed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SERVE = ("act in process", "act through the server", "added by the server", "served / in process")
MONITOR = ("act without the monitor", "act with the monitor", "with / without, p50", "reading / act, p50")


@pytest.mark.parametrize(("bench", "lines"), [("bench_serve", SERVE), ("bench_monitor", MONITOR)])
def test_make_bench_measures_the_runtime_against_the_runner_in_process(bench, lines, tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"tests.benchmarks.{bench}", "--calls", "2", "--threads", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for line in lines:
        assert line in done.stdout
