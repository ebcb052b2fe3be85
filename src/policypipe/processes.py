"""Worker processes that cannot hang: one place that starts a process pool.

fork is used where there is one: a spawned worker spends ~0.7 s importing what the parent has
loaded already, and a stdin script cannot be re-imported by spawn. A forked child inherits the
parent's memory but not its threads, so a lock held by a thread of the parent stays held in the
child forever. OpenCV's thread pool is such a case: once the parent has run a parallel OpenCV
call, a child's first OpenCV call waits on a thread that does not exist, forever
(tests/test_processes.py). So the parent's pool is
stopped before every fork, and workers run OpenCV single-threaded: processes give the
parallelism, threads would only compete.
"""

from __future__ import annotations

import multiprocessing
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
        workers, mp_context=multiprocessing.get_context(method), initializer=_init, initargs=(initializer,)
    )


def _init(initializer: Callable[[], None] | None) -> None:
    single_threaded_opencv()
    if initializer is not None:
        initializer()
