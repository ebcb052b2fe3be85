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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def single_threaded_opencv() -> None:
    import cv2

    cv2.setNumThreads(1)


def _context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )


class _Pool(ProcessPoolExecutor):
    def __exit__(self, exc_type, exc, tb) -> bool:
        # Left by an exception (a full disk, Ctrl-C, SIGTERM): the tasks not started never start, and
        # the running ones finish (or fail the same way), so the caller's cleanup after the pool is
        # left races no worker. A plain pool would run every task still queued first.
        self.shutdown(wait=True, cancel_futures=exc_type is not None)
        return False


def process_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A pool of `workers` processes, each running OpenCV with one thread, then `initializer`. Left
    by an exception, it cancels the tasks not started and waits for the running ones."""
    single_threaded_opencv()
    return _Pool(workers, mp_context=_context(), initializer=_init, initargs=(os.getpid(), initializer))


def each_in_own_process(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R | None]:
    """`fn(item)` for every item, each in a process of its own, `workers` of them at a time; the
    results in the order of `items`, None for an item whose process died. An exception `fn` raises
    is raised here, once the processes still running have finished.

    A pool cannot do this: one dead worker breaks the whole pool, and which item killed it is
    unknown. Here a death costs its own item only."""
    single_threaded_opencv()
    context = _context()
    results: dict[int, tuple[bool, Any] | None] = {}
    running: dict[Connection, tuple[int, multiprocessing.process.BaseProcess]] = {}
    todo = list(enumerate(items))[::-1]
    done = 0
    try:
        while done < len(items):
            while todo and len(running) < workers:
                index, item = todo.pop()
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_run_one, args=(os.getpid(), fn, item, sender), daemon=True)
                process.start()
                sender.close()  # the child's copy alone: its death is the pipe's end
                running[receiver] = (index, process)
            for receiver in wait(list(running)):
                index, process = running.pop(receiver)
                try:
                    results[index] = receiver.recv()
                except EOFError:
                    results[index] = None  # it died before it answered
                receiver.close()
                process.join()
            while done in results:
                outcome = results.pop(done)
                done += 1
                if outcome is None:
                    yield None
                    continue
                succeeded, value = outcome
                if not succeeded:
                    raise value
                yield value
    finally:
        for receiver, (_, process) in running.items():
            process.join()
            receiver.close()


def _run_one(parent_pid: int, fn: Callable[[Any], Any], item: Any, sender: Connection) -> None:
    _init(parent_pid, None)
    try:
        outcome = (True, fn(item))
    except BaseException as exc:  # noqa: BLE001 - the parent raises it
        outcome = (False, exc)
    sender.send(outcome)


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
