"""A nearest-neighbour baseline that learns nothing (VINN-style, Pari et al. 2021).

Each training window (an anchor of the training episodes, every `train_stride`-th) is stored as
a feature vector and its recorded action chunk; an observation's chunk is the mean of the chunks
of its `k` nearest training windows (Euclidean distance), the rotation re-orthonormalised.

Features, three blocks (shapes for O observation steps, an image of S x S pixels):
- pose (O-1)*9: the previous observation steps' poses relative to the current one (the current
  one is the identity and says nothing);
- width O: the observed gripper widths;
- pixels S*S*3: the current frame, area-averaged to S x S, in [0, 1].
Every dimension is divided by its standard deviation over the training windows, then each block
by the square root of its size and multiplied by its weight, so a weight says how much the block
counts whatever its size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr

from policypipe.dataset import layout
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.dataset.windows import (
    EpisodeStreams,
    WindowConfig,
    rot6d,
    rot6d_to_matrix,
)

BLOCKS = ("pose", "width", "pixels")
# Queries per distance pass: (chunk, M) float64 distances, 16 MB for 8,000 training windows.
QUERY_CHUNK = 256
# Frames read and pooled at a time: pooling works on a float64 copy, 98 KB a 64x64 frame, so a whole
# training side at once took 13 GB for 480 recordings; a chunk keeps it near 100 MB.
POOL_CHUNK = 1024


@dataclass(frozen=True)
class NearestNeighbourConfig:
    k: int
    weights: dict[str, float]  # per block of `BLOCKS`
    image_size: int
    train_stride: int

    def __post_init__(self) -> None:
        if self.k < 1 or self.image_size < 1 or self.train_stride < 1:
            raise ValueError("nearest neighbour k, image_size and train_stride must be >= 1")
        if set(self.weights) != set(BLOCKS) or min(self.weights.values()) < 0:
            raise ValueError(f"nearest neighbour weights must be >= 0, one for each of {BLOCKS}")


def downsample(frames: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, size*size*3) area averages in [0, 1], POOL_CHUNK frames at a time
    (each frame's average is its own: the chunks do not change a bit of it)."""
    out = [np.zeros((0, size * size * 3))]
    for start in range(0, len(frames), POOL_CHUNK):
        chunk = np.ascontiguousarray(frames[start : start + POOL_CHUNK])
        x = torch.from_numpy(chunk).permute(0, 3, 1, 2).double() / 255.0
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, size)  # (n, 3, size, size)
        out.append(pooled.permute(0, 2, 3, 1).reshape(len(chunk), -1).numpy())
    return np.concatenate(out)


def pooled_frames(store: Path, rows: np.ndarray, size: int) -> np.ndarray:
    """`downsample` of the stored camera 0 frames at `rows`, read POOL_CHUNK at a time: a training
    side's frames are never all in memory at once (955 MB of uint8 for 480 recordings)."""
    reader = FrameShardReader(store, layout.RGB)
    parts = [np.zeros((0, size * size * 3))]
    for start in range(0, len(rows), POOL_CHUNK):
        parts.append(downsample(reader.read_many(rows[start : start + POOL_CHUNK]), size))
    return np.concatenate(parts)


def feature_blocks(obs_pose: np.ndarray, obs_width: np.ndarray, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """{block: (N, D_block)} from obs_pose (N, O, 9), obs_width (N, O, 1) and the current frames'
    `downsample` (N, S*S*3). Pose and width pass through float32, as the policy's batches hold
    them, so a training window and the same observation read as a sample give the same features."""
    n = len(obs_pose)
    as_batch = lambda a: np.asarray(a, dtype=np.float32).astype(np.float64)  # noqa: E731
    return {
        "pose": as_batch(obs_pose)[:, :-1].reshape(n, -1),
        "width": as_batch(obs_width).reshape(n, -1),
        "pixels": pixels,
    }


def block_scales(train_blocks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per block, (D,) the divisor of each dimension: its training std times sqrt(D); a constant
    dimension gets 1 (it adds nothing to any distance between training windows)."""
    scales = {}
    for name, x in train_blocks.items():
        std = x.std(axis=0)
        scales[name] = np.where(std > 1e-12, std, 1.0) * np.sqrt(max(x.shape[1], 1))
    return scales


def weighted_features(
    blocks: dict[str, np.ndarray], scales: dict[str, np.ndarray], weights: dict[str, float]
) -> np.ndarray:
    """(N, D) the blocks standardised, weighted and side by side, in the blocks' order."""
    return np.concatenate([weights[b] * blocks[b] / scales[b] for b in blocks], axis=1)


def nearest(train: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """(N, k) indices of each query's k nearest training rows, nearest first; ties go to the lower
    index, so the result is deterministic."""
    k = min(k, len(train))
    train_sq = np.einsum("md,md->m", train, train)
    out = []
    for s in range(0, len(queries), QUERY_CHUNK):
        q = queries[s : s + QUERY_CHUNK]
        d = np.einsum("nd,nd->n", q, q)[:, None] - 2 * q @ train.T + train_sq[None]
        out.append(np.argsort(np.maximum(d, 0.0), axis=1, kind="stable")[:, :k])
    return np.concatenate(out)


def average_chunks(chunks: np.ndarray) -> np.ndarray:
    """(N, k, T, 10 G) -> (N, T, 10 G): the mean, each gripper's rotation projected back onto a rotation."""
    mean = chunks.mean(axis=1)
    for g in range(mean.shape[-1] // 10):
        mean[..., 10 * g + 3 : 10 * g + 9] = rot6d(rot6d_to_matrix(mean[..., 10 * g + 3 : 10 * g + 9]))
    return mean


@dataclass(frozen=True)
class TrainingWindows:
    blocks: dict[str, np.ndarray]  # {block: (M, D_block)}
    chunks: np.ndarray  # (M, T, 10) their recorded action chunks


def training_windows(
    store: Path, episodes: list[int], window: WindowConfig, config: NearestNeighbourConfig
) -> TrainingWindows:
    """Every `train_stride`-th anchor of the training episodes, as features and chunks."""
    root = zarr.open_group(store, mode="r")
    streams = EpisodeStreams.from_store(root)
    anchors, _ = streams.anchors(episodes, window)
    w = streams.windows(anchors[:: config.train_stride], window)
    pixels = pooled_frames(store, w.obs_frames[:, -1], config.image_size)
    return TrainingWindows(feature_blocks(w.obs_pose, w.obs_width, pixels), w.action)


@dataclass(frozen=True)
class NearestNeighbourIndex:
    """The training windows, featurised once, for every side evaluated."""

    config: NearestNeighbourConfig
    scales: dict[str, np.ndarray]
    features: np.ndarray  # (M, D) weighted
    chunks: np.ndarray  # (M, T, 10)
    build_s: float  # reading and featurising the training windows

    @classmethod
    def build(
        cls, store: Path, train_episodes: list[int], window: WindowConfig, config: NearestNeighbourConfig
    ) -> NearestNeighbourIndex:
        t0 = time.perf_counter()
        train = training_windows(store, train_episodes, window, config)
        scales = block_scales(train.blocks)
        features = weighted_features(train.blocks, scales, config.weights)
        return cls(config, scales, features, train.chunks, time.perf_counter() - t0)

    def chunks_for(
        self, obs_pose: np.ndarray, obs_width: np.ndarray, current_frames: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """(N, T, 10) the baseline's chunks for the observations, and the search's seconds."""
        t0 = time.perf_counter()
        queries = weighted_features(
            feature_blocks(obs_pose, obs_width, downsample(current_frames, self.config.image_size)),
            self.scales,
            self.config.weights,
        )
        chunks = average_chunks(self.chunks[nearest(self.features, queries, self.config.k)])
        return chunks, time.perf_counter() - t0
