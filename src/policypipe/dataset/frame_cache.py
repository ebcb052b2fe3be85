"""Decoded frames kept in memory for training: each JPEG decoded once a run, not once a sample.

A frame is in n_obs_steps samples an epoch and a run goes through several epochs (the demo about
6, with one observation step), so decoding on demand decodes every frame several times (the demo's
about 6 times, over a dozen with two observation steps); on 2 CPU cores the loading workers'
decoding takes cycles from the step itself (docs/training.md, "Throughput").
`DecodedFrames` decodes the frames the samples can show up front, up to a budget in bytes, into
one uint8 array; what does not fit is decoded on demand as before. The bytes are the decoder's
either way: the weights do not change.

With loading workers the array is in shared memory, filled before they start, which then only
read it: one copy for all of them, and nothing to synchronise.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

import numpy as np
import torch

from policypipe.dataset.frame_shards import FrameShardReader

log = logging.getLogger(__name__)

# Shared memory lives in /dev/shm on Linux, often small in containers (Docker's default is 64 MB),
# where writing past its size kills the process with SIGBUS: the cache takes at most this share of
# what is free there, and says so when that is less than the budget.
SHARED_MEMORY = "/dev/shm"
SHARED_MEMORY_SHARE = 0.5


def shared_memory_free() -> int | None:
    """Bytes free in /dev/shm, or None where there is none to read (the system's own limit holds)."""
    return shutil.disk_usage(SHARED_MEMORY).free if os.path.isdir(SHARED_MEMORY) else None


class DecodedFrames:
    """Frames `rows` of `reader`'s array, decoded, as many as `budget_bytes` hold (the first in
    row order); `read_many` serves them from memory and has a reader of the same array decode
    the others (each process its own reader: file handles are per process)."""

    def __init__(self, reader: FrameShardReader, rows: np.ndarray, budget_bytes: int, shared: bool) -> None:
        frame_shape = tuple(reader.shape[1:])
        frame_bytes = int(np.prod(frame_shape))
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        kept = rows[: max(0, budget_bytes) // frame_bytes]
        self.slot = np.full(len(reader), -1, dtype=np.int64)
        self.slot[kept] = np.arange(len(kept))
        frames = torch.empty((len(kept), *frame_shape), dtype=torch.uint8)
        if shared and len(kept):
            frames.share_memory_()
        self.frames = frames
        t0 = time.perf_counter()
        array = frames.numpy()
        for slot, row in enumerate(kept):
            array[slot] = reader.read(int(row))
        self.rows_kept, self.rows_asked = len(kept), len(rows)
        if len(kept):
            log.info(
                "%s: %d of %d frames decoded into memory (%.0f MB) in %.1f s",
                reader.array_dir,
                len(kept),
                len(rows),
                len(kept) * frame_bytes / 1e6,
                time.perf_counter() - t0,
            )

    @property
    def nbytes(self) -> int:
        return self.frames.numel()

    def read_many(self, rows: np.ndarray, reader: FrameShardReader) -> np.ndarray:
        """(len(rows), H, W, 3) uint8: what `reader.read_many(rows)` returns."""
        slots = self.slot[np.asarray(rows, dtype=np.int64)]
        frames = self.frames.numpy()
        if (slots >= 0).all():
            return frames[slots]
        return np.stack([frames[s] if s >= 0 else reader.read(int(r)) for r, s in zip(rows, slots)])


def cache_budget(budget_bytes: int, shared: bool) -> tuple[int, str | None]:
    """The bytes the cache may take, and why that is less than `budget_bytes` where it is."""
    if not shared:
        return budget_bytes, None
    free = shared_memory_free()
    if free is None or free * SHARED_MEMORY_SHARE >= budget_bytes:
        return budget_bytes, None
    allowed = int(free * SHARED_MEMORY_SHARE)
    return allowed, (
        f"{SHARED_MEMORY} has {free / 1e6:.0f} MB free, so the decoded-frame cache takes "
        f"{allowed / 1e6:.0f} MB of train.frame_cache_mb's {budget_bytes / 1e6:.0f}; the rest is decoded "
        "on demand (give the container more shared memory, e.g. docker run --shm-size, or set "
        "train.num_workers 0)"
    )
