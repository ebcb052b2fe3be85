"""The evaluation's samples: the training windows at evenly spaced anchors; only damaged frames skip an
episode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from policypipe.dataset import layout
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import EpisodeStreams, WindowConfig, episode_bounds
from policypipe.evaluation.samples import collect_samples, mean_motion
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=2, horizon=6, n_action_steps=3)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    # Episodes of 20 frames in shards of 10: episode 1 is frames 20..39, shards 2 and 3 alone.
    make_store(tmp_path / "ds.zarr", lengths=(20, 20, 20), drop_fraction=0.25)
    return tmp_path / "ds.zarr"


def test_samples_are_every_stride_th_training_window(store: Path) -> None:
    samples = collect_samples(store, [0, 2], WINDOW, stride=4)
    data = WindowDataset(store, [0, 2], WINDOW)
    expected = [i for e in (0, 2) for i in np.flatnonzero(data.anchor_episodes == e)[::4]]
    assert samples.anchors.tolist() == data.anchors[expected].tolist()
    assert samples.episodes.tolist() == data.anchor_episodes[expected].tolist()
    for k, i in enumerate(expected):
        for key, value in data[int(i)].items():
            assert torch.equal(samples.batch[key][k], value), key
    assert samples.skipped == []


def test_an_unreadable_frame_skips_its_episode_and_is_counted(store: Path) -> None:
    (store / "data" / "camera0_rgb" / "c" / "3" / "0" / "0" / "0").unlink()  # frames 30..39, episode 1
    samples = collect_samples(store, [0, 1, 2], WINDOW, stride=3)
    assert set(samples.episodes.tolist()) == {0, 2}
    (skipped,) = samples.skipped
    assert skipped["episode"] == 1
    assert (
        skipped["reason"].startswith("UnreadableFrame: frame 3") and "FileNotFoundError" in skipped["reason"]
    )


def test_a_corrupt_jpeg_is_an_unreadable_frame(store: Path) -> None:
    shard = store / "data" / "camera0_rgb" / "c" / "2" / "0" / "0" / "0"  # frames 20..29, episode 1
    data = bytearray(shard.read_bytes())
    data[:200] = bytes(200)  # the first frame's JPEG header and more
    shard.write_bytes(bytes(data))
    samples = collect_samples(store, [0, 1, 2], WINDOW, stride=1)
    assert [s["episode"] for s in samples.skipped] == [1]
    assert "not a decodable JPEG" in samples.skipped[0]["reason"]


def test_any_other_exception_fails_the_evaluation(store: Path, monkeypatch) -> None:
    def broken(self, i):
        raise ZeroDivisionError("a bug, not damaged data")

    monkeypatch.setattr(FrameShardReader, "read", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        collect_samples(store, [0, 1, 2], WINDOW, stride=3)


def test_mean_motion_is_the_mean_training_action_chunk(store: Path) -> None:
    streams = EpisodeStreams.from_store(zarr.open_group(store, mode="r"))
    anchors, _ = streams.anchors([0, 2], WINDOW)
    expected = streams.windows(anchors, WINDOW).action.mean(axis=0)
    np.testing.assert_allclose(mean_motion(streams, [0, 2], WINDOW, block=7), expected, atol=1e-12)
    first, last = episode_bounds(zarr.open_group(store, mode="r")[layout.EPISODE_ENDS][:])
    assert len(anchors) < (last - first + 1)[[0, 2]].sum()  # the last frames are no anchors
