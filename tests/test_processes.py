"""Process pools started after the parent used OpenCV's thread pool."""

from __future__ import annotations

import subprocess
import sys

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
