"""Offline evaluation of a policy on the held-out episodes, against baselines.

At evenly spaced timesteps of the validation episodes (the split from `stats`) the recorded
observations go to the policy (EMA weights, DDIM, seeded noise) and its action chunk is
compared with the recorded future. Baselines on the same samples: "hold still" and "mean
motion" (the training episodes' mean relative trajectory); the camera ablation feeds a
constant image instead of the frames; the spread of several samples for one observation
measures multimodality.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.errors import chunk_errors, hold_still, mean_pairwise_distance_mm, summarize
from policypipe.evaluation.samples import Samples, collect_samples, mean_motion
from policypipe.policy.diffusion import DiffusionPolicy

log = logging.getLogger(__name__)

COMPONENTS = ("position_mm", "rotation_deg", "width_mm")


@dataclass(frozen=True)
class EvalConfig:
    """`eval` section of params.yaml."""

    seed: int = 0
    # Every `stride`-th frame of each validation episode is a sample.
    stride: int = 8
    batch_size: int = 64
    # Multimodality: this many noise samples for each of `spread_observations` observations.
    spread_samples: int = 8
    spread_observations: int = 16
    plot_episodes: int = 3

    def __post_init__(self) -> None:
        if self.stride < 1 or self.batch_size < 1 or self.spread_samples < 2 or self.spread_observations < 1:
            raise ValueError("stride, batch_size, spread_observations must be >= 1 and spread_samples >= 2")


@torch.no_grad()
def predict(policy: DiffusionPolicy, batch: dict[str, torch.Tensor], batch_size: int, seed: int,
            constant_image: torch.Tensor | None = None) -> np.ndarray:
    """(N, T, 10) predicted chunks; noise seeded per batch, so results are reproducible."""
    policy.eval()
    out = []
    n = len(batch["action"])
    for b, s in enumerate(range(0, n, batch_size)):
        part = {k: v[s : s + batch_size] for k, v in batch.items() if k != "action"}
        if constant_image is not None:
            part["obs_images"] = constant_image.expand_as(part["obs_images"]).clone()
        generator = torch.Generator().manual_seed(seed * 1_000_003 + b)
        out.append(policy.predict_action(part, generator).double().numpy())
    return np.concatenate(out)


def evaluate(policy: DiffusionPolicy, store: Path, stats: dict[str, Any], config: EvalConfig) -> dict[str, Any]:
    pc = policy.config
    window = WindowConfig(pc.n_obs_steps, pc.horizon, pc.n_action_steps)
    samples = collect_samples(store, stats["split"]["val"], window, config.stride)
    recorded = samples.batch["action"].double().numpy()
    log.info("evaluating on %d samples of %d validation episodes", len(samples), len(stats["split"]["val"]))

    predicted = predict(policy, samples.batch, config.batch_size, config.seed)
    (image_stats,) = stats["image"].values()
    grey = torch.tensor([round(255 * m) for m in image_stats["mean"]], dtype=torch.uint8)  # the mean colour
    ablated = predict(policy, samples.batch, config.batch_size, config.seed, constant_image=grey)
    current_width = samples.batch["obs_width"][:, -1, 0].double().numpy()
    chunks = {
        "policy": predicted,
        "hold_still": hold_still(current_width, pc.horizon),
        "mean_motion": np.broadcast_to(mean_motion(store, stats["split"]["train"], window), recorded.shape),
        "camera_ablation": ablated,
    }
    errors = {name: chunk_errors(chunk, recorded) for name, chunk in chunks.items()}

    report: dict[str, Any] = {"samples": len(samples), "episodes": len(set(samples.episodes.tolist())),
                              "skipped_episodes": len(samples.skipped)}
    per_step = []
    for name, errs in errors.items():
        summaries = {c: summarize(errs[c], pc.n_action_steps) for c in COMPONENTS}
        report[name] = {c: {k: v for k, v in s.items() if k != "per_step_mean"} for c, s in summaries.items()}
        for h, value in enumerate(summaries["position_mm"]["per_step_mean"]):
            if len(per_step) <= h:
                per_step.append({"step": h + 1})
            per_step[h][name] = value
    for baseline in ("hold_still", "mean_motion"):
        report[f"ratio_to_{baseline}"] = {
            c: report["policy"][c]["executed"]["mean"] / max(report[baseline][c]["executed"]["mean"], 1e-12) for c in COMPONENTS
        }
    report["camera_ablation_gap_position_mm"] = (
        report["camera_ablation"]["position_mm"]["executed"]["mean"] - report["policy"]["position_mm"]["executed"]["mean"]
    )
    report["spread_mm"] = _spread(policy, samples, config)
    report["skipped"] = samples.skipped
    return {"report": report, "per_step_position_mm": per_step, "samples": samples, "chunks": chunks}


def _spread(policy: DiffusionPolicy, samples: Samples, config: EvalConfig) -> float:
    picks = np.unique(np.linspace(0, len(samples) - 1, min(config.spread_observations, len(samples))).round().astype(int))
    spreads = []
    for i in picks:
        repeated = {k: v[i : i + 1].expand(config.spread_samples, *v.shape[1:]).clone() for k, v in samples.batch.items()}
        draws = predict(policy, repeated, config.spread_samples, config.seed + 1 + int(i))
        spreads.append(mean_pairwise_distance_mm(draws, policy.config.n_action_steps))
    return float(np.mean(spreads))


def paired_executed_errors(policy: DiffusionPolicy, samples: Samples, config: EvalConfig) -> dict[str, np.ndarray]:
    """Per sample (N,): executed-step mean errors, for paired comparisons of policies."""
    predicted = predict(policy, samples.batch, config.batch_size, config.seed)
    errs = chunk_errors(predicted, samples.batch["action"].double().numpy())
    return {c: errs[c][:, : policy.config.n_action_steps].mean(axis=1) for c in COMPONENTS}


def compare_policies(a: DiffusionPolicy, b: DiffusionPolicy, store: Path, stats: dict[str, Any], config: EvalConfig,
                     resamples: int = 2000) -> dict[str, Any]:
    """Both policies on the same samples: errors of each, and B - A with a bootstrap 95% CI."""
    from policypipe.evaluation.errors import bootstrap_mean_ci

    if (a.config.n_obs_steps, a.config.horizon) != (b.config.n_obs_steps, b.config.horizon):
        raise ValueError("the policies see different observation windows or horizons: their samples are not comparable")
    window = WindowConfig(a.config.n_obs_steps, a.config.horizon, min(a.config.n_action_steps, b.config.n_action_steps))
    samples = collect_samples(store, stats["split"]["val"], window, config.stride)
    errs_a, errs_b = paired_executed_errors(a, samples, config), paired_executed_errors(b, samples, config)
    result: dict[str, Any] = {"samples": len(samples)}
    for c in COMPONENTS:
        diff = errs_b[c] - errs_a[c]
        lo, hi = bootstrap_mean_ci(diff, config.seed, resamples)
        result[c] = {"a": float(errs_a[c].mean()), "b": float(errs_b[c].mean()), "b_minus_a": float(diff.mean()),
                     "ci95": [lo, hi]}
    return result


def verdict(component: str, comparison: dict[str, Any]) -> str:
    unit = component.split("_")[-1]
    name = component.rsplit("_", 1)[0]
    d, (lo, hi) = comparison["b_minus_a"], comparison["ci95"]
    if lo <= 0 <= hi:
        return f"no clear difference on {name}: B - A = {d:+.2f} {unit}, 95% CI [{lo:+.2f}, {hi:+.2f}]"
    better = "B" if d < 0 else "A"
    return f"{better} is better on {name} by {abs(d):.2f} {unit}, 95% CI of B - A [{lo:+.2f}, {hi:+.2f}]"
