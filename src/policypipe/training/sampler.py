"""Which samples each optimizer step sees: a pure function of (seed, step), whatever the number of
processes or the accumulation, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from policypipe.dataset.window_dataset import WindowDataset

# ---------------------------------------------------------------- pieces


class EpochSampler:
    """Batches of indices: a fresh seeded permutation per epoch, every batch full.

    Global batch g (one optimizer step) is a pure function of (seed, g), so a run resumes
    exactly from its step count (the DataLoader reads ahead of what the loop consumed, so the
    sampler's own position would not do), whatever the accumulation splits it into.
    """

    def __init__(self, n: int, batch_size: int, seed: int, start_batch: int = 0) -> None:
        if n < batch_size:
            raise ValueError(f"{n} training samples, fewer than one batch of {batch_size}")
        self.n, self.batch_size, self.seed, self.start_batch = n, batch_size, seed, start_batch

    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        g = self.start_batch
        while True:
            epoch, position = divmod(g, self.batches_per_epoch())
            order = torch.randperm(
                self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            )
            start = position * self.batch_size
            yield order[start : start + self.batch_size].tolist()
            g += 1


class MicroBatches:
    """This process's micro-batches: its share of each global batch, split for accumulation.

    Every rank walks the same sampler sequence. Consecutive micro-batches of a step are
    consecutive slices of one global batch, so halving the micro-batch and doubling the
    accumulation feeds each optimizer step exactly the same samples.
    """

    def __init__(self, sampler: EpochSampler, rank: int, world: int, accum: int) -> None:
        self.sampler, self.rank, self.world, self.accum = sampler, rank, world, accum

    def __iter__(self):
        for batch in self.sampler:
            share = len(batch) // self.world
            mine = batch[self.rank * share : (self.rank + 1) * share]
            micro = share // self.accum
            for k in range(self.accum):
                yield mine[k * micro : (k + 1) * micro]


def fixed_val_batches(val_set: WindowDataset, batch_size: int, count: int) -> list[dict[str, torch.Tensor]]:
    """Evenly spaced held-out samples, loaded once: the same every time validation runs."""
    n = min(len(val_set), batch_size * count)
    picks = np.linspace(0, len(val_set) - 1, n).round().astype(int)
    items = [val_set[int(i)] for i in picks]
    return [
        {k: torch.stack([it[k] for it in items[s : s + batch_size]]) for k in items[0]}
        for s in range(0, n, batch_size)
    ]
