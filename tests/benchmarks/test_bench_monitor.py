"""The monitor's benchmark of `make bench` runs and prints its ratio."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_make_bench_monitor_measures_the_reading_against_a_chunks_act(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench_monitor", "--calls", "2", "--threads", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for line in (
        "act without the monitor",
        "act with the monitor",
        "with / without, p50",
        "reading / act, p50",
    ):
        assert line in done.stdout
