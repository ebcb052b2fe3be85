"""Offline evaluation of a joint-space policy (`dataset.joint`) on the held-out episodes, against
baselines.

As `evaluation.evaluate` does for gripper poses: the same held-out sides (test the headline,
validation beside it), the same samples (every `stride`-th anchor of an episode), seeded DDIM noise,
camera ablations and 95% CIs by a bootstrap over episodes, then samples within them. What differs
is what a chunk is: per step the D commanded joint positions, absolute. An error is the absolute
difference in the dataset's own units (ALOHA: radians for the arm joints, the gripper's normalised
opening), averaged over the arm joints ("joints") and over the gripper dimensions ("grippers"), and
reported per joint as well. The baselines, none of them learned:

- hold still: the current joint vector, repeated;
- mean motion: the training episodes' mean chunk relative to their current joint vector, added to
  the current one;
- constant velocity: the last observed joint velocity continued, step k at k + 1 periods after the
  anchor (a command leads the arm that follows it; one period is the least lead);
- nearest neighbour: the mean of the `nn_k` nearest training windows' chunks, each relative to its
  own current joint vector, added to the current one; windows compared by their observed joint
  vectors (weight `nn_pose_weight`) and camera 0's current frame (`nn_pixel_weight`), as
  `nearest_neighbour` does for poses.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from policypipe.dataset.joint_windows import JointSeries
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.errors import joint_constant_velocity, joint_errors, joint_hold_still
from policypipe.evaluation.evaluate import (
    EvalConfig,
    ablation_gaps,
    error_report,
    over_sides,
    side_chunks,
)
from policypipe.evaluation.nearest_neighbour import (
    block_scales,
    downsample,
    nearest,
    pooled_frames,
    weighted_features,
)
from policypipe.evaluation.samples import Samples, collect_samples, motion_window, recorded_observations
from policypipe.policy.diffusion import DiffusionPolicy

log = logging.getLogger(__name__)

BASELINES = ("hold_still", "mean_motion", "constant_velocity", "nearest_neighbour")
COMPONENT_MEANING = {
    "joints": "mean absolute error over the arm joints, in the dataset's units (ALOHA: radians)",
    "grippers": "mean absolute error over the gripper dimensions, in the dataset's units "
    "(ALOHA: the normalised opening)",
}


@dataclass(frozen=True)
class JointNearestNeighbour:
    """The training windows, featurised once: observed joint vectors and camera 0's current frame."""

    weights: dict[str, float]
    k: int
    image_size: int
    scales: dict[str, np.ndarray]
    features: np.ndarray  # (M, F) weighted
    offsets: np.ndarray  # (M, H, D) their chunks minus their current joint vector
    build_s: float

    @staticmethod
    def blocks(obs_state: np.ndarray, pixels: np.ndarray) -> dict[str, np.ndarray]:
        """From the observed joint vectors and the current frames' `downsample`."""
        as_batch = np.asarray(obs_state, np.float32).astype(np.float64)  # as the policy's batches hold it
        return {"state": as_batch.reshape(len(as_batch), -1), "pixels": pixels}

    @classmethod
    def build(
        cls, store: Path, series: JointSeries, episodes: list[int], window: WindowConfig, config: EvalConfig
    ) -> JointNearestNeighbour:
        t0 = time.perf_counter()
        anchors, _ = series.anchors(episodes, window)
        w = series.windows(anchors[:: config.nn_train_stride], window)
        blocks = cls.blocks(w.obs_state, pooled_frames(store, w.obs_frames[:, -1], config.nn_image_size))
        weights = {"state": config.nn_pose_weight, "pixels": config.nn_pixel_weight}
        scales = block_scales(blocks)
        features = weighted_features(blocks, scales, weights)
        offsets = w.action - w.obs_state[:, -1:]
        return cls(
            weights, config.nn_k, config.nn_image_size, scales, features, offsets, time.perf_counter() - t0
        )

    def chunks_for(self, obs_state: np.ndarray, current_frames: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        blocks = self.blocks(obs_state, downsample(current_frames, self.image_size))
        queries = weighted_features(blocks, self.scales, self.weights)
        picks = nearest(self.features, queries, self.k)
        chunks = obs_state[:, -1:] + self.offsets[picks].mean(axis=1)
        return chunks, time.perf_counter() - t0


@dataclass(frozen=True)
class JointBaselines:
    window: WindowConfig  # the policy's: the samples'
    series: JointSeries  # the recording, for the samples' observations over `motion`
    mean_offset: np.ndarray  # (H, D): the training chunks' mean, relative to their current joint vector
    nearest_neighbour: JointNearestNeighbour

    @property
    def motion(self) -> WindowConfig:
        """What constant velocity and the nearest neighbour read (`motion_window`)."""
        return motion_window(self.window)

    @classmethod
    def build(
        cls, store: Path, stats: dict[str, Any], window: WindowConfig, config: EvalConfig
    ) -> JointBaselines:
        series = JointSeries.from_store(zarr.open_group(store, mode="r"))
        train = stats["split"]["train"]
        anchors, _ = series.anchors(train, window)
        w = series.windows(anchors, window)
        mean_offset = (w.action - w.obs_state[:, -1:]).mean(axis=0)
        nearest_neighbour = JointNearestNeighbour.build(store, series, train, motion_window(window), config)
        return cls(window, series, mean_offset, nearest_neighbour)

    def chunks(self, samples: Samples) -> tuple[dict[str, np.ndarray], float]:
        """The baselines' chunks (N, T, D) on the samples and the nearest neighbour's search seconds:
        constant velocity and the nearest neighbour on the recorded joint vectors over `motion`."""
        obs_state = samples.batch["obs_state"].double().numpy()
        recorded = recorded_observations(samples, ("obs_state",), self.motion, self.series)["obs_state"]
        horizon = self.window.horizon
        chunks = {
            "hold_still": joint_hold_still(obs_state, horizon),
            "mean_motion": obs_state[:, -1:] + self.mean_offset[None],
            "constant_velocity": joint_constant_velocity(recorded, horizon),
        }
        chunks["nearest_neighbour"], search_s = self.nearest_neighbour.chunks_for(
            recorded, samples.batch["obs_images"][:, -1].numpy()
        )
        return chunks, search_s


def evaluate_joint_space(
    policy: DiffusionPolicy, store: Path, stats: dict[str, Any], config: EvalConfig
) -> dict[str, Any]:
    """`evaluation.evaluate.evaluate` for a joint-space policy: the report of every held-out side,
    the headline's per-step errors (over the arm joints), samples and chunks, the baselines' seconds."""
    pc = policy.config
    if not pc.joint_space:
        raise ValueError(
            "evaluate_joint_space takes a joint-space policy; evaluate a pose policy with evaluate"
        )
    window = WindowConfig(pc.n_obs_steps, pc.horizon, pc.n_action_steps)
    series_names = tuple(stats["joints"]["names"])
    if series_names != pc.joint_names:
        raise ValueError(
            f"the policy's joints {list(pc.joint_names)} are not the statistics' {list(series_names)}: "
            "evaluate it on the dataset it was trained on"
        )
    grippers = set(stats["joints"]["grippers"])
    gripper_dims = [d for d, name in enumerate(pc.joint_names) if name in grippers]
    baselines = JointBaselines.build(store, stats, window, config)
    result = over_sides(
        stats,
        lambda episodes: _evaluate_side(policy, store, episodes, stats, baselines, gripper_dims, config),
        baselines.nearest_neighbour.build_s,
    )
    result["report"]["representation"] = "joint"
    return result


def _evaluate_side(
    policy: DiffusionPolicy,
    store: Path,
    episodes: list[int],
    stats: dict[str, Any],
    baselines: JointBaselines,
    gripper_dims: list[int],
    config: EvalConfig,
) -> dict[str, Any]:
    pc = policy.config
    n = pc.n_action_steps
    samples = collect_samples(store, episodes, baselines.window, config.stride)
    recorded = samples.batch["action"].double().numpy()
    log.info("evaluating on %d samples of %d held-out episodes", len(samples), len(episodes))
    chunks, baseline_names, omitted, search_s = side_chunks(policy, samples, baselines, stats, config)

    errors = {name: joint_errors(chunk, recorded, gripper_dims) for name, chunk in chunks.items()}
    components = tuple(errors["policy"])  # the arm joints first, when there are any
    report, per_step, executed, summary = error_report(errors, components, samples, baseline_names, n, config)
    report["components"] = {c: COMPONENT_MEANING[c] for c in components}
    # Per joint: the policy's and the best baseline's executed error.
    best = report["best_baseline"][components[0]]
    report["per_joint_executed"] = {
        who: {
            name: float(np.abs(chunks[who][..., d] - recorded[..., d])[:, :n].mean())
            for d, name in enumerate(pc.joint_names)
        }
        for who in ("policy", best)
    }
    report[f"camera_ablation_gap_{components[0]}"] = ablation_gaps(
        executed, summary, components[0], samples, config
    )
    report["omitted"] = omitted
    report["skipped"] = samples.skipped
    return {
        "report": report,
        "per_step": per_step,
        "samples": samples,
        "chunks": chunks,
        "search_s": search_s,
    }
