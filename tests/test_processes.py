"""Process pools started after the parent used OpenCV's thread pool, workers that die with their
parent, and work that goes on after a worker died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from policypipe.processes import each_in_own_process, process_pool
from tests.leftovers import describe, group_members, wait_until_gone

SCRIPT = """
import cv2, numpy as np
from policypipe.processes import process_pool

def work(i):
    return int(cv2.resize(np.full((2000, 2000, 3), i, np.uint8), (500, 500), interpolation=cv2.INTER_AREA).sum())

cv2.setNumThreads(4)
work(1)  # the parent's OpenCV thread pool now exists; a forked child inherits its locks, not its threads
with process_pool(2) as pool:
    print(sorted(pool.map(work, range(4))))
"""  # noqa: E501


def test_a_pool_forked_after_opencv_ran_threads_in_the_parent_does_not_hang() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(500 * 500 * 3 * i for i in range(4)))


ORPHAN_SCRIPT = """
import time
from policypipe.processes import process_pool

with process_pool(1) as pool:
    pool.submit(time.sleep, 600)
    print("submitted", flush=True)
    time.sleep(600)
"""


def test_a_pool_worker_dies_with_its_parent_killed_by_sigkill() -> None:
    # A stage killed with SIGKILL (or by the out-of-memory killer) runs no exit handler: without
    # the parent-death signal its worker converted on for nobody, 20 minutes and more.
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout.readline().strip() == "submitted"
        deadline = time.monotonic() + 30
        while len(group_members(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(parent.pid)) >= 2, "the pool's worker never started"
        os.kill(parent.pid, signal.SIGKILL)  # the parent alone, as the OOM killer does
        parent.wait()
        left = wait_until_gone(lambda: group_members(parent.pid), 10)
        assert not left, f"the worker outlived its parent:\n{describe(left)}"
    finally:
        if group_members(parent.pid):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.stdout.close()


def _square_or_die(i: int) -> int:
    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 4:
        raise ValueError("four")
    time.sleep(0.05 * (5 - i))  # later items finish first: the results still come in order
    return i * i


def test_each_in_own_process_answers_in_order_and_a_death_costs_its_own_item_only() -> None:
    assert list(each_in_own_process(_square_or_die, [0, 1, 2, 3], workers=2)) == [0, 1, None, 9]


def test_each_in_own_process_raises_what_the_function_raised() -> None:
    results = each_in_own_process(_square_or_die, [3, 4, 5], workers=3)
    assert next(results) == 9
    with pytest.raises(ValueError, match="four"):
        next(results)


def _append_after_a_while(path: str) -> None:
    time.sleep(0.2)
    with open(path, "a") as log:
        log.write("ran\n")


def test_a_pool_left_by_an_exception_runs_no_task_not_started_and_waits_for_the_running(tmp_path) -> None:
    log = tmp_path / "log"
    with pytest.raises(KeyboardInterrupt), process_pool(1) as pool:
        futures = [pool.submit(_append_after_a_while, str(log)) for _ in range(5)]
        time.sleep(0.1)  # the first one is running
        raise KeyboardInterrupt
    # What had started finished before the pool was left: the running one and those already handed to
    # the worker's queue (concurrent.futures fills it to max_workers + 1 calls, so on a loaded machine
    # two may wait there behind the running one). Every other task was cancelled and never ran.
    started = [f for f in futures if not f.cancelled()]
    assert all(f.done() and f.exception() is None for f in started)
    assert log.read_text() == "ran\n" * len(started)
    assert len(started) <= 3
