"""Training samples: one per anchor frame of the chosen episodes, edge-padded windows.

Low-dimensional arrays are small and held in memory; images are decoded on demand, in the
DataLoader's workers, through `FrameShardReader` (never the whole image array in RAM).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr
from torch.utils.data import Dataset

from policypipe.dataset import layout
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.dataset.windows import WindowConfig, actions, episode_bounds, observations, window_indices


class WindowDataset(Dataset):
    def __init__(self, store: Path, episodes: list[int], window: WindowConfig) -> None:
        if not episodes:
            raise ValueError("no episodes to sample from")
        self.store, self.window = Path(store), window
        root = zarr.open_group(self.store, mode="r")
        self.pos = root[layout.EEF_POS][:].astype(np.float64)
        self.rotvec = root[layout.EEF_ROT][:].astype(np.float64)
        self.width = root[layout.GRIPPER_WIDTH][:, 0].astype(np.float64)
        first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
        self.anchors = np.concatenate([np.arange(first[e], last[e] + 1) for e in episodes])
        owner = np.concatenate([np.full(last[e] - first[e] + 1, e) for e in episodes])
        self.first, self.last = first[owner], last[owner]
        self._frames: FrameShardReader | None = None  # opened in each worker on first use

    def __len__(self) -> int:
        return len(self.anchors)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self._frames is None:
            self._frames = FrameShardReader(self.store, layout.RGB)
        a, lo, hi = self.anchors[i : i + 1], self.first[i : i + 1], self.last[i : i + 1]
        obs_pose, obs_width = observations(self.pos, self.rotvec, self.width, a, lo, hi, self.window)
        act = actions(self.pos, self.rotvec, self.width, a, lo, hi, self.window)
        frame_idx = window_indices(a, lo, hi, np.arange(-self.window.n_obs_steps + 1, 1))[0]
        return {
            "obs_images": torch.from_numpy(self._frames.read_many(frame_idx)),
            "obs_pose": torch.from_numpy(obs_pose[0].astype(np.float32)),
            "obs_width": torch.from_numpy(obs_width[0].astype(np.float32)),
            "action": torch.from_numpy(act[0].astype(np.float32)),
        }

    def __getstate__(self) -> dict:
        # Workers open their own reader: file handles and caches are per process.
        state = dict(self.__dict__)
        state["_frames"] = None
        return state
