"""Errors between action chunks, and their summaries. Pure functions on arrays.

An action chunk is (N, H, 10): per horizon step, position (3, metres) and 6D rotation (6)
relative to the current gripper pose, and the gripper width (1, metres).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def rot6d_to_matrix(r6: np.ndarray) -> np.ndarray:
    """(..., 6) -> (..., 3, 3): Gram-Schmidt on the two stored columns."""
    a, b = r6[..., :3], r6[..., 3:6]
    c1 = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b - np.sum(c1 * b, axis=-1, keepdims=True) * c1
    c2 = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.stack([c1, c2, np.cross(c1, c2)], axis=-1)


def chunk_errors(predicted: np.ndarray, recorded: np.ndarray) -> dict[str, np.ndarray]:
    """Per sample and horizon step (N, H): position (mm), rotation (degrees, geodesic), width (mm)."""
    position = 1000 * np.linalg.norm(predicted[..., :3] - recorded[..., :3], axis=-1)
    r_pred, r_rec = rot6d_to_matrix(predicted[..., 3:9]), rot6d_to_matrix(recorded[..., 3:9])
    cos = (np.trace(np.swapaxes(r_pred, -1, -2) @ r_rec, axis1=-2, axis2=-1) - 1) / 2
    rotation = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    width = 1000 * np.abs(predicted[..., 9] - recorded[..., 9])
    return {"position_mm": position, "rotation_deg": rotation, "width_mm": width}


def summarize(errors: np.ndarray, n_action_steps: int) -> dict[str, Any]:
    """Mean, median and p90 over the executed steps and over the whole horizon; mean per step."""
    def stats(x: np.ndarray) -> dict[str, float]:
        per_sample = x.mean(axis=1)
        return {"mean": float(per_sample.mean()), "median": float(np.median(per_sample)), "p90": float(np.percentile(per_sample, 90))}

    return {
        "executed": stats(errors[:, :n_action_steps]),
        "horizon": stats(errors),
        "per_step_mean": [float(v) for v in errors.mean(axis=0)],
    }


def hold_still(current_width: np.ndarray, horizon: int) -> np.ndarray:
    """(N, H, 10): the current pose repeated (identity relative pose) with the current width."""
    n = len(current_width)
    chunk = np.zeros((n, horizon, 10))
    chunk[..., 3] = 1.0  # first rotation column (1, 0, 0)
    chunk[..., 7] = 1.0  # second rotation column (0, 1, 0)
    chunk[..., 9] = np.asarray(current_width).reshape(n, 1)
    return chunk


def mean_pairwise_distance_mm(samples: np.ndarray, n_action_steps: int) -> float:
    """Spread of K samples for one observation: mean pairwise distance of their executed
    position trajectories, (K, H, 10) -> mm."""
    pos = samples[:, :n_action_steps, :3]
    k = len(pos)
    d = [np.linalg.norm(pos[i] - pos[j], axis=-1).mean() for i in range(k) for j in range(i + 1, k)]
    return float(1000 * np.mean(d)) if d else 0.0


def bootstrap_mean_ci(values: np.ndarray, seed: int, resamples: int = 2000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of paired differences."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(resamples, len(values)))
    means = values[idx].mean(axis=1)
    lo, hi = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)
