"""The evaluation's samples: evenly spaced anchors of the validation episodes with their recorded
observations and futures (the windows training samples, `dataset.windows`), and the training
episodes' mean motion (a baseline)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policypipe.dataset.frame_shards import UnreadableFrame
from policypipe.dataset.joint_windows import JointSeries
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import EpisodeStreams, WindowConfig

log = logging.getLogger(__name__)


@dataclass
class Samples:
    batch: dict[
        str, torch.Tensor
    ]  # WindowDataset's items stacked: obs_images (N, O, H, W, 3), ..., action (N, T, 10 G)
    episodes: np.ndarray  # (N,) episode index of each sample
    anchors: np.ndarray  # (N,) frame index of each sample
    skipped: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.anchors)


def motion_window(window: WindowConfig) -> WindowConfig:
    """The baselines' window: at least two observation steps, so that constant velocity and the
    nearest neighbour see the recording's last motion even where the policy observes one step (a
    policy that sees its own last motion in closed loop continues it, docs/rollout.md; a baseline
    reading the recording has no such loop)."""
    return replace(window, n_obs_steps=max(2, window.n_obs_steps))


def collect_samples(
    store: Path, episodes: list[int], window: WindowConfig, stride: int, episode_start: bool = False
) -> Samples:
    """Every `stride`-th anchor of each episode (the anchors training samples); `episode_start`: with
    what a policy with a memory of its episode's start reads (`WindowDataset`).

    An episode with a frame that cannot be read (`UnreadableFrame`: damaged data) is skipped and
    counted; any other exception is a fault of the code or the setup, and is raised.
    """
    data = WindowDataset(store, episodes, window, episode_start=episode_start)
    items, owners, anchors, skipped = [], [], [], []
    for e in episodes:
        picks = np.flatnonzero(data.anchor_episodes == e)[::stride]
        try:
            episode_items = [data[int(i)] for i in picks]
        except UnreadableFrame as exc:
            log.warning("episode %d skipped: %s", e, exc)
            skipped.append({"episode": e, "reason": f"{type(exc).__name__}: {exc}"})
            continue
        items += episode_items
        owners += [e] * len(picks)
        anchors += data.anchors[picks].tolist()
    if not items:
        raise ValueError(f"no sample could be read from episodes {episodes}")
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
    return Samples(batch, np.asarray(owners), np.asarray(anchors), skipped)


def recorded_observations(
    samples: Samples, keys: tuple[str, ...], motion: WindowConfig, series: EpisodeStreams | JointSeries
) -> dict[str, np.ndarray]:
    """The samples' low-dimensional observations `keys` (float64, (N, O, ...)) over `motion`: the
    samples' own where they span its observation steps, else read again from the recording at
    their anchors (a window's fields carry the batch keys' names)."""
    if samples.batch[keys[0]].shape[1] == motion.n_obs_steps:
        return {k: samples.batch[k].double().numpy() for k in keys}
    read = series.windows(samples.anchors, motion)
    return {k: getattr(read, k) for k in keys}


def mean_motion(
    streams: EpisodeStreams, episodes: list[int], window: WindowConfig, block: int = 32768
) -> np.ndarray:
    """(T, 10 G): the training episodes' mean relative action chunk over their anchors (rotation
    re-orthonormalised later)."""
    anchors, _ = streams.anchors(episodes, window)
    total = np.zeros((window.horizon, 10 * streams.grippers))
    for s in range(0, len(anchors), block):
        total += streams.windows(anchors[s : s + block], window).action.sum(axis=0)
    return total / len(anchors)
