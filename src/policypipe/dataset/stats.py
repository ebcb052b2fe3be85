"""Normalization statistics of the training episodes, computed over the zarr arrays.

Low-dimensional statistics are computed in the representation the policy uses (relative
poses over the observation and action windows of `windows.py`, on the time axis, at the
anchors training samples; a joint-space dataset's absolute joint vectors, `dataset.joint_windows`),
vectorised over blocks of anchor frames: never a per-sample loop, never an image decoded. Two
passes over the blocks: the first gathers count, mean and variance (Chan's parallel merge,
float64), min and max; the second fills a fine histogram between min and max, from which q01 and
q99 are read. A quantile is therefore within one bin, (max - min) / `quantile_bins`, of the two
order statistics that bracket it: on dense data, within one bin of the exact value.

Images: per-channel mean and std over an evenly spaced sample of training frames.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from policypipe.dataset import layout
from policypipe.dataset.events import dataset_events, event_labels, label_statistics
from policypipe.dataset.joint_windows import JointSeries, open_series
from policypipe.dataset.split import RULE, SPLIT_BY, episode_groups, split_episodes
from policypipe.dataset.windows import (
    EpisodeStreams,
    FrameAxis,
    WindowConfig,
    episode_bounds,
    observation_names,
)

log = logging.getLogger(__name__)

QUANTILES = (0.01, 0.99)


@dataclass(frozen=True)
class StatsConfig:
    """`stats` section of params.yaml."""

    # Seed of the train/validation/test split (dataset/split.py: a stable hash of each group's name).
    seed: int = 0
    # Fractions of groups held out for validation (every choice is made on it) and for the test
    # side (what eval reports), approximately; at least one on each side. test_fraction 0: none.
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    # What is held out together: "recording" (its stem) or "session" (its export folder).
    split_by: str = "recording"
    # Frames sampled, evenly spaced over the training episodes, for the image statistics.
    image_sample_frames: int = 1000
    # Anchor frames per vectorised block (memory: ~block x horizon x 10 float64).
    block_frames: int = 32768
    # Histogram bins per dimension for the quantiles (tolerance: range / bins).
    quantile_bins: int = 16384

    def __post_init__(self) -> None:
        if not (
            0 < self.val_fraction and 0 <= self.test_fraction and self.val_fraction + self.test_fraction < 1
        ):
            raise ValueError(
                f"val_fraction {self.val_fraction}, test_fraction {self.test_fraction}: need "
                "val_fraction > 0, test_fraction >= 0 (0: no test side) and their sum below 1"
            )
        if self.image_sample_frames < 1 or self.block_frames < 1 or self.quantile_bins < 16:
            raise ValueError("image_sample_frames and block_frames must be >= 1, quantile_bins >= 16")
        if self.split_by not in SPLIT_BY:
            raise ValueError(f"split_by must be one of {SPLIT_BY}, got {self.split_by!r}")


class _Moments:
    """Per-dimension count, mean, M2, min, max; merged block by block (Chan et al.)."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.mean = np.zeros(dim)
        self.m2 = np.zeros(dim)
        self.min = np.full(dim, np.inf)
        self.max = np.full(dim, -np.inf)

    def add(self, x: np.ndarray) -> None:  # x: (M, dim)
        m = len(x)
        if m == 0:
            return
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        delta = mean_b - self.mean
        total = self.n + m
        self.mean = self.mean + delta * m / total
        self.m2 = self.m2 + m2_b + delta**2 * self.n * m / total
        self.n = total
        self.min = np.minimum(self.min, x.min(axis=0))
        self.max = np.maximum(self.max, x.max(axis=0))


class _Histogram:
    def __init__(self, lo: np.ndarray, hi: np.ndarray, bins: int) -> None:
        self.lo, self.hi, self.bins = lo, hi, bins
        self.width = np.where(hi > lo, (hi - lo) / bins, 1.0)
        self.counts = np.zeros((len(lo), bins), dtype=np.int64)

    def add(self, x: np.ndarray) -> None:
        b = np.clip(((x - self.lo) / self.width).astype(np.int64), 0, self.bins - 1)
        for d in range(x.shape[1]):
            self.counts[d] += np.bincount(b[:, d], minlength=self.bins)

    def quantile(self, q: float) -> np.ndarray:
        out = np.empty(len(self.lo))
        for d, counts in enumerate(self.counts):
            cum = np.cumsum(counts)
            rank = q * (cum[-1] - 1)
            k = int(np.searchsorted(cum, rank, side="right"))
            below = cum[k - 1] if k > 0 else 0
            frac = (rank - below + 0.5) / max(counts[k], 1)
            out[d] = self.lo[d] + (k + min(max(frac, 0.0), 1.0)) * self.width[d]
        return np.clip(out, self.lo, self.hi)


def _windowed(streams: FrameAxis, episodes: list[int], window: WindowConfig, block: int):
    """Yields {name: (M, dim) float64 block} over every anchor frame of the given episodes."""
    anchors, _ = streams.anchors(episodes, window)
    for start in range(0, len(anchors), block):
        yield streams.windows(anchors[start : start + block], window).lowdim_blocks()


def grippers_layout(grippers: int) -> dict[str, Any]:
    """What the low-dimensional statistics of several grippers hold, block by block."""
    return {
        "count": grippers,
        "obs.eef_pose_rel": observation_names(grippers),  # 9 numbers each
        "obs.gripper_width": [f"robot{i}" for i in range(grippers)],  # 1 each
        "action": [f"robot{i}" for i in range(grippers)],  # 10 each
    }


def joints_layout(names: tuple[str, ...]) -> dict[str, Any]:
    """What the low-dimensional statistics of a joint-space dataset hold: obs.joint_state and
    action are the D joints in this order (action_per_step: H times D)."""
    return {"names": list(names), "grippers": layout.gripper_joints(names)}


def observation_image_offsets(
    streams: FrameAxis, episodes: list[int], window: WindowConfig
) -> dict[str, Any]:
    """How far, per observation step (oldest first), the image is from the time its pose is
    sampled at: mean and max |capture time - observation time| over the anchors, in ms."""
    anchors, _ = streams.anchors(episodes, window)
    _, offset = streams.observation_frames(anchors, window)
    ms = 1000 * np.abs(offset)
    return {
        "anchors": int(len(anchors)),
        "mean": np.round(ms.mean(axis=0), 3).tolist(),
        "max": np.round(ms.max(axis=0), 3).tolist(),
    }


def lowdim_statistics(
    streams: FrameAxis, episodes: list[int], window: WindowConfig, config: StatsConfig
) -> dict[str, dict]:
    moments: dict[str, _Moments] = {}
    for blk in _windowed(streams, episodes, window, config.block_frames):
        for name, x in blk.items():
            moments.setdefault(name, _Moments(x.shape[1])).add(x)
    hists = {name: _Histogram(m.min, m.max, config.quantile_bins) for name, m in moments.items()}
    for blk in _windowed(streams, episodes, window, config.block_frames):
        for name, x in blk.items():
            hists[name].add(x)
    out = {}
    for name, m in moments.items():
        q01, q99 = (hists[name].quantile(q) for q in QUANTILES)
        out[name] = {
            "count": int(m.n),
            "min": m.min.tolist(),
            "max": m.max.tolist(),
            "mean": m.mean.tolist(),
            "std": np.sqrt(m.m2 / max(m.n, 1)).tolist(),
            "q01": q01.tolist(),
            "q99": q99.tolist(),
        }
    return out


def image_sample_indices(root: zarr.Group, episodes: list[int], frames: int, camera: int = 0) -> np.ndarray:
    """Evenly spaced rows of the episodes where `camera` has a frame (camera 0: every row)."""
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    pool = np.concatenate([np.arange(first[e], last[e] + 1) for e in episodes])
    if camera != 0:
        pool = pool[root[layout.camera_valid(camera)][:][pool]]
        if not len(pool):
            raise ValueError(
                f"camera {camera} has no frame in the training episodes: nothing to learn it from"
            )
    picks = np.unique(np.linspace(0, len(pool) - 1, min(frames, len(pool))).round().astype(np.int64))
    return pool[picks]


def image_statistics(root: zarr.Group, episodes: list[int], frames: int, camera: int = 0) -> dict[str, Any]:
    """Per-channel mean and std (0-1 scale) over evenly spaced training frames of `camera` (its
    rows without a frame left out)."""
    rgb = root[layout.camera_rgb(camera)]
    indices = image_sample_indices(root, episodes, frames, camera)
    total = np.zeros(3)
    total_sq = np.zeros(3)
    pixels = 0
    for start in range(0, len(indices), 256):
        batch = rgb.get_orthogonal_selection((indices[start : start + 256],)).astype(np.float64) / 255.0
        total += batch.sum(axis=(0, 1, 2))
        total_sq += (batch**2).sum(axis=(0, 1, 2))
        pixels += batch.shape[0] * batch.shape[1] * batch.shape[2]
    mean = total / pixels
    return {
        "count": int(len(indices)),
        "mean": mean.tolist(),
        "std": np.sqrt(np.maximum(total_sq / pixels - mean**2, 0)).tolist(),
    }


def compute_statistics(root: zarr.Group, window: WindowConfig, config: StatsConfig) -> dict[str, Any]:
    episodes = root.attrs[layout.ATTRS_EPISODES]
    split = split_episodes(
        episode_groups(episodes, config.split_by), config.seed, config.val_fraction, config.test_fraction
    )
    train = split.train
    log.info(
        "statistics over %d training episodes (%d validation, %d test held out)",
        len(train),
        len(split.val),
        len(split.test),
    )
    streams = open_series(root)  # loaded (and its interpolators built) once, for every pass
    return {
        # Grasps and releases read off each episode's width stream, and the statistics of the labels
        # they give the training frames (dataset.events; train.model.event_loss_weight).
        **({"events": events} if (events := _events(root, train)) else {}),
        "split": {
            "rule": RULE,
            "split_by": config.split_by,
            "seed": config.seed,
            "val_fraction": config.val_fraction,
            "test_fraction": config.test_fraction,
            "train": train,
            "val": split.val,
            "test": split.test,
            "train_stems": [episodes[i]["stem"] for i in train],
            "val_stems": [episodes[i]["stem"] for i in split.val],
            "test_stems": [episodes[i]["stem"] for i in split.test],
        },
        "window": {
            "n_obs_steps": window.n_obs_steps,
            "horizon": window.horizon,
            "n_action_steps": window.n_action_steps,
        },
        # Several grippers: which gripper each block of 9 (pose) or 10 (action) numbers is.
        **(
            {"grippers": grippers_layout(streams.grippers)}
            if isinstance(streams, EpisodeStreams) and streams.grippers > 1
            else {}
        ),
        # Joint space: what each of the D numbers of a state and an action is.
        **({"joints": joints_layout(streams.joint_names)} if isinstance(streams, JointSeries) else {}),
        "lowdim": lowdim_statistics(streams, train, window, config),
        "observation_image_offset_ms": observation_image_offsets(streams, train, window),
        "image": {
            layout.camera_rgb(k): image_statistics(root, train, config.image_sample_frames, k)
            for k in root.attrs[layout.ATTRS_CAMERAS]
        },
        "quantile_tolerance": "within one bin, (max - min) / quantile_bins, "
        "of the order statistics bracketing the quantile",
        "quantile_bins": config.quantile_bins,
    }


def _events(root: zarr.Group, train: list[int]) -> dict[str, Any]:
    """The dataset's events and the statistics of their labels over the training episodes' rows
    (a joint-space dataset has none: {})."""
    events = dataset_events(root)
    if not events:
        return {}
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    rows = np.concatenate([np.arange(first[e], last[e] + 1) for e in train])
    return {**events, "labels": label_statistics(event_labels(root, events), rows)}
