"""Training samples: one per anchor frame of the chosen episodes (`windows.FrameAxis.anchors`),
with windows on the time axis (`dataset.windows`; a joint-space dataset's, `dataset.joint_windows`).

The frame times and the recorded pose and width samples (or joint vectors) are small and held in
memory; a sample interpolates only the few samples its window spans. Images are decoded on demand, in the
DataLoader's workers, through `FrameShardReader` (never the whole image array in RAM), or, after
`keep_decoded_frames`, read from memory as far as its budget goes (`dataset.frame_cache`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr
from torch.utils.data import Dataset

from policypipe.dataset import layout
from policypipe.dataset.frame_cache import DecodedFrames, cache_budget
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.dataset.joint_windows import open_series
from policypipe.dataset.windows import WindowConfig


class WindowDataset(Dataset):
    """`row_features`: {batch key: (N, D) array, one row per dataset row}, each sample's rows of
    its observation steps under that key (the privileged control's scene state); `images` False
    leaves the frames out (for a policy that takes none); `episode_start` adds what a policy with a
    memory of its episode's start reads (`PolicyConfig.remember_release`): `start_image` (H, W, 3),
    camera 0's first frame of the sample's episode, and `start_pose` (G, 9), each gripper's pose
    there relative to the sample's current one (`EpisodeStreams.episode_start`)."""

    def __init__(
        self,
        store: Path,
        episodes: list[int],
        window: WindowConfig,
        row_features: dict[str, np.ndarray] | None = None,
        images: bool = True,
        episode_start: bool = False,
    ) -> None:
        if not episodes:
            raise ValueError("no episodes to sample from")
        self.store, self.window = Path(store), window
        self.row_features = dict(row_features or {})
        self.images = images
        self.episode_start = episode_start
        if episode_start and not images:
            raise ValueError("episode_start adds the episode's first frame: it needs images")
        root = zarr.open_group(self.store, mode="r")
        self.streams = open_series(root)
        # Cameras beyond camera 0: their frames at the same rows, and whether a row has one.
        self.cameras = [k for k in root.attrs[layout.ATTRS_CAMERAS] if k != 0]
        self.valid = {k: root[layout.camera_valid(k)][:] for k in self.cameras}
        rows = root[layout.TIMESTAMP].shape[0]
        for key, features in self.row_features.items():
            if len(features) != rows:
                raise ValueError(f"{key} has {len(features)} rows, the dataset {store} has {rows}")
        # (M,) frame index of each sample's anchor, and its episode.
        self.anchors, self.anchor_episodes = self.streams.anchors(episodes, window)
        if not len(self.anchors):
            reach = self.streams.chunk_offsets(window)[window.horizon - window.n_action_steps]
            raise ValueError(
                f"episodes {episodes} have no anchor frame: each is shorter than the {reach:.3f} s that "
                "horizon - n_action_steps + 1 = "
                f"{window.horizon - window.n_action_steps + 1} action steps need"
            )
        self._frames: dict[int, FrameShardReader] | None = None  # opened in each worker on first use
        self._decoded: dict[int, DecodedFrames] = {}

    def keep_decoded_frames(self, budget_bytes: int, shared: bool) -> list[str]:
        """Decodes the frames this dataset's samples show into memory, camera 0's first, as many
        as `budget_bytes` hold (`dataset.frame_cache`); `shared`: in shared memory, for loading
        workers started after this. Returns what the user should know (a smaller budget)."""
        if not self.images:
            return []
        budget, note = cache_budget(budget_bytes, shared)
        rows, _ = self.streams.observation_frames(self.anchors, self.window)
        if self.episode_start:  # the episodes' first frames too (unique rows: each decoded once)
            rows = np.concatenate([rows.reshape(-1), self.streams.first[np.unique(self.anchor_episodes)]])
        for k in [0, *self.cameras]:
            reader = FrameShardReader(self.store, layout.camera_rgb(k))
            self._decoded[k] = cache = DecodedFrames(reader, rows, budget, shared)
            budget -= cache.nbytes
        return [note] if note else []

    def __len__(self) -> int:
        return len(self.anchors)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """Samples `indices`, their windows computed in one vectorised call: what the DataLoader
        asks for a batch at a time (the same numbers as one sample at a time, `windows.windows`)."""
        anchors = self.anchors[np.asarray(indices, dtype=np.int64)]
        w = self.streams.windows(anchors, self.window)
        items = [
            {
                **{k: torch.from_numpy(v.astype(np.float32)) for k, v in w.observation_arrays(j).items()},
                "action": torch.from_numpy(w.action[j].astype(np.float32)),
                **{k: torch.from_numpy(v[rows].astype(np.float32)) for k, v in self.row_features.items()},
            }
            for j, rows in enumerate(w.obs_frames)
        ]
        if not self.images:
            return items
        if self._frames is None:
            self._frames = {k: FrameShardReader(self.store, layout.camera_rgb(k)) for k in [0, *self.cameras]}
        for k in [0, *self.cameras]:
            frames = self._read_frames(k, w.obs_frames.reshape(-1))
            frames = frames.reshape(*w.obs_frames.shape, *frames.shape[1:])  # (M, O, H, W, 3)
            key = "obs_images" if k == 0 else f"obs_images_camera{k}"
            for item, rows, sample_frames in zip(items, w.obs_frames, frames):
                item[key] = torch.from_numpy(sample_frames)
                if k:
                    item[f"obs_valid_camera{k}"] = torch.from_numpy(self.valid[k][rows])
        if self.episode_start:
            first, poses = self.streams.episode_start(anchors)
            for item, frame, pose in zip(items, self._read_frames(0, first), poses):
                item["start_image"] = torch.from_numpy(frame)
                item["start_pose"] = torch.from_numpy(pose.astype(np.float32))
        return items

    def _read_frames(self, camera: int, rows: np.ndarray) -> np.ndarray:
        decoded = self._decoded.get(camera)
        if decoded is None:
            return self._frames[camera].read_many(rows)
        return decoded.read_many(rows, self._frames[camera])

    def __getstate__(self) -> dict:
        # Workers open their own readers (file handles and index caches are per process); the decoded
        # frames go with the dataset, in shared memory when there are workers.
        state = dict(self.__dict__)
        state["_frames"] = None
        return state
