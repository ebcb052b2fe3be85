"""Worker processes that cannot hang: one place that starts a process pool.

fork is used where there is one: a spawned worker spends ~0.7 s importing what the parent has
loaded already, and a stdin script cannot be re-imported by spawn. A forked child inherits the
parent's memory but not its threads, so a lock held by a thread of the parent stays held in the
child forever. OpenCV's thread pool is such a case: once the parent has run a parallel OpenCV
call, a child's first OpenCV call waits on a thread that does not exist, forever
(tests/test_processes.py). So the parent's pool is
stopped before every fork, and workers run OpenCV single-threaded: processes give the
parallelism, threads would only compete.

A worker dies with the process that started it (Linux: the parent-death signal): a stage killed
with SIGKILL, or by the out-of-memory killer, leaves no worker converting on for nobody.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor


def single_threaded_opencv() -> None:
    import cv2

    cv2.setNumThreads(1)


def process_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A pool of `workers` processes, each running OpenCV with one thread, then `initializer`."""
    single_threaded_opencv()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_init,
        initargs=(os.getpid(), initializer),
    )


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent goes; at once if it is gone already (it may have died
    between the fork and this call). Elsewhere than Linux, a no-op."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _init(parent_pid: int, initializer: Callable[[], None] | None) -> None:
    die_with_parent(parent_pid)
    single_threaded_opencv()
    if initializer is not None:
        initializer()
