"""The evaluation's samples: evenly spaced anchors of the validation episodes with their recorded
observations and futures, and the training episodes' mean motion (a baseline)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from policypipe.dataset import layout
from policypipe.dataset.windows import WindowConfig, actions, episode_bounds
from policypipe.training.data import WindowDataset

log = logging.getLogger(__name__)


@dataclass
class Samples:
    batch: dict[str, torch.Tensor]  # obs_images (N, O, H, W, 3), obs_pose, obs_width, action (N, T, 10)
    episodes: np.ndarray  # (N,) episode index of each sample
    anchors: np.ndarray  # (N,) frame index of each sample
    skipped: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.anchors)


def collect_samples(store: Path, episodes: list[int], window: WindowConfig, stride: int) -> Samples:
    """Evenly spaced samples of each episode; an episode that cannot be read is skipped and counted."""
    items, owners, anchors, skipped = [], [], [], []
    for e in episodes:
        try:
            data = WindowDataset(store, [e], window)
            picks = range(0, len(data), stride)
            episode_items = [data[i] for i in picks]
            items += episode_items
            owners += [e] * len(episode_items)
            anchors += [int(data.anchors[i]) for i in picks]
        except Exception as exc:  # noqa: BLE001 - one broken episode must not stop the evaluation
            log.warning("episode %d skipped: %s", e, exc)
            skipped.append({"episode": e, "reason": f"{type(exc).__name__}: {exc}"})
    if not items:
        raise ValueError(f"no sample could be read from episodes {episodes}")
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
    return Samples(batch, np.asarray(owners), np.asarray(anchors), skipped)


def mean_motion(store: Path, episodes: list[int], window: WindowConfig, block: int = 32768) -> np.ndarray:
    """(T, 10): the training episodes' mean relative action chunk (rotation re-orthonormalised later)."""
    root = zarr.open_group(store, mode="r")
    pos = root[layout.EEF_POS][:].astype(np.float64)
    rotvec = root[layout.EEF_ROT][:].astype(np.float64)
    width = root[layout.GRIPPER_WIDTH][:, 0].astype(np.float64)
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    anchors = np.concatenate([np.arange(first[e], last[e] + 1) for e in episodes])
    owner = np.concatenate([np.full(last[e] - first[e] + 1, e) for e in episodes])
    total = np.zeros((window.horizon, 10))
    for s in range(0, len(anchors), block):
        a, o = anchors[s : s + block], owner[s : s + block]
        total += actions(pos, rotvec, width, a, first[o], last[o], window).sum(axis=0)
    return total / len(anchors)
