"""Decoded frames kept in memory: the same bytes as decoding on demand, within a budget, shared
with loading workers, and damage found before training starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from policypipe.dataset import frame_cache, layout
from policypipe.dataset.frame_cache import DecodedFrames
from policypipe.dataset.frame_shards import FrameShardReader, UnreadableFrame
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=2, horizon=6, n_action_steps=3)


def frame_bytes(store: Path) -> int:
    return int(np.prod(FrameShardReader(store, layout.RGB).shape[1:]))


def test_cached_frames_are_the_decoders_and_the_rest_is_decoded_on_demand(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr")
    reader = FrameShardReader(tmp_path / "ds.zarr", layout.RGB)
    rows = np.array([40, 3, 3, 17, 90, 150])
    cache = DecodedFrames(reader, rows, budget_bytes=3 * frame_bytes(tmp_path / "ds.zarr"), shared=False)
    # Three fit: the first three distinct rows in row order (3, 17, 40); 90 and 150 stay on disk.
    assert (cache.rows_kept, cache.rows_asked) == (3, 5)
    assert cache.slot[[3, 17, 40]].tolist() == [0, 1, 2] and cache.slot[[90, 150]].tolist() == [-1, -1]
    asked = [150, 3, 40, 90, 17, 3]
    assert np.array_equal(cache.read_many(asked, reader), reader.read_many(asked))
    assert np.array_equal(cache.read_many([17, 40], reader), reader.read_many([17, 40]))


def test_a_dataset_with_cached_frames_gives_the_same_samples_in_workers(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr")
    plain = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    cached = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    assert cached.keep_decoded_frames(10**9, shared=True) == []
    assert cached._decoded[0].frames.is_shared() and cached._decoded[0].rows_kept > 0
    # Workers started after the cache read it; half the frames fit, the rest they decode.
    half = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    half.keep_decoded_frames(50 * frame_bytes(tmp_path / "ds.zarr"), shared=True)
    assert 0 < half._decoded[0].rows_kept < half._decoded[0].rows_asked
    for dataset in (cached, half):
        ours = list(DataLoader(dataset, batch_size=16, num_workers=2, shuffle=False))
        theirs = list(DataLoader(plain, batch_size=16, num_workers=0, shuffle=False))
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_cache_fits_in_the_shared_memory_there_is_and_says_so(tmp_path: Path, monkeypatch) -> None:
    make_store(tmp_path / "ds.zarr")
    one = frame_bytes(tmp_path / "ds.zarr")
    # A container's /dev/shm with room for 20 frames: the cache takes half of it (writing past it
    # would kill the process), and the user is told why and what to change.
    monkeypatch.setattr(frame_cache, "shared_memory_free", lambda: 20 * one)
    dataset = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    (note,) = dataset.keep_decoded_frames(10**9, shared=True)
    assert "/dev/shm" in note and "train.frame_cache_mb" in note and "--shm-size" in note
    assert dataset._decoded[0].rows_kept == 10
    # In the process's own memory (no workers) there is no such limit.
    alone = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    assert alone.keep_decoded_frames(10**9, shared=False) == []
    assert alone._decoded[0].rows_kept == alone._decoded[0].rows_asked


def test_a_damaged_frame_stops_training_before_it_starts_naming_the_file(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr")
    shard = tmp_path / "ds.zarr" / layout.RGB / "c" / "0" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 1  # inside the shard's index
    shard.write_bytes(bytes(raw))
    dataset = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    with pytest.raises(UnreadableFrame, match=r"frame 0 of .*camera0_rgb.*checksum"):
        dataset.keep_decoded_frames(10**9, shared=False)
