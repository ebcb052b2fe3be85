"""Errors between action chunks, the no-learning baselines, and the statistics that summarise
them (bootstrap confidence intervals over seeds, episodes and samples). Pure functions on arrays.

An action chunk is (N, H, 10): per horizon step, position (3, metres) and 6D rotation (6)
relative to the current gripper pose, and the gripper width's change from the current width
(1, metres); a width error is therefore the same as an error of the absolute width. A joint-space
chunk (`joint_*`) is (N, H, D) absolute joint commands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policypipe.dataset.windows import rot6d, rot6d_to_matrix

# The error components of a pose chunk, in the order every report lists them.
COMPONENTS = ("position_mm", "rotation_deg", "width_mm")


def chunk_errors(predicted: np.ndarray, recorded: np.ndarray) -> dict[str, np.ndarray]:
    """Per sample and horizon step (N, H): position (mm), rotation (degrees, geodesic), width (mm)."""
    position = 1000 * np.linalg.norm(predicted[..., :3] - recorded[..., :3], axis=-1)
    r_pred, r_rec = rot6d_to_matrix(predicted[..., 3:9]), rot6d_to_matrix(recorded[..., 3:9])
    cos = (np.trace(np.swapaxes(r_pred, -1, -2) @ r_rec, axis1=-2, axis2=-1) - 1) / 2
    rotation = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    width = 1000 * np.abs(predicted[..., 9] - recorded[..., 9])
    return {"position_mm": position, "rotation_deg": rotation, "width_mm": width}


def gripper_chunks(chunk: np.ndarray) -> list[np.ndarray]:
    """(..., 10 G) -> G views (..., 10): each gripper's relative pose and width change."""
    if chunk.shape[-1] % 10:
        raise ValueError(f"a chunk has 10 numbers per gripper, got {chunk.shape[-1]}")
    return [chunk[..., 10 * g : 10 * (g + 1)] for g in range(chunk.shape[-1] // 10)]


def whole_errors(predicted: np.ndarray, recorded: np.ndarray) -> dict[str, np.ndarray]:
    """`chunk_errors` of chunks of G grippers (..., 10 G): each component averaged over the grippers
    (one gripper: its own errors)."""
    per_gripper = [chunk_errors(p, r) for p, r in zip(gripper_chunks(predicted), gripper_chunks(recorded))]
    if len(per_gripper) == 1:
        return per_gripper[0]
    return {c: np.mean([e[c] for e in per_gripper], axis=0) for c in per_gripper[0]}


def executed_errors(chunk: np.ndarray, recorded: np.ndarray, n_action_steps: int) -> dict[str, np.ndarray]:
    """Per sample (N,): each component's error averaged over the executed steps (and the grippers):
    what `eval` reports and what the checkpoints are ranked by."""
    errs = whole_errors(chunk, recorded)
    return {c: errs[c][:, :n_action_steps].mean(axis=1) for c in COMPONENTS}


def summarize(errors: np.ndarray, n_action_steps: int) -> dict[str, Any]:
    """Mean, median and p90 over the executed steps and over the whole horizon; mean per step."""

    def stats(x: np.ndarray) -> dict[str, float]:
        per_sample = x.mean(axis=1)
        return {
            "mean": float(per_sample.mean()),
            "median": float(np.median(per_sample)),
            "p90": float(np.percentile(per_sample, 90)),
        }

    return {
        "executed": stats(errors[:, :n_action_steps]),
        "horizon": stats(errors),
        "per_step_mean": [float(v) for v in errors.mean(axis=0)],
    }


def hold_still(samples: int, horizon: int, grippers: int = 1) -> np.ndarray:
    """(N, H, 10 G): the current poses and widths kept (identity relative pose, no width change)."""
    chunk = np.zeros((samples, horizon, grippers, 10))
    chunk[..., 3] = 1.0  # first rotation column (1, 0, 0)
    chunk[..., 7] = 1.0  # second rotation column (0, 1, 0)
    return chunk.reshape(samples, horizon, 10 * grippers)


def mean_pairwise_distance_mm(samples: np.ndarray, n_action_steps: int) -> float:
    """Spread of K samples for one observation: mean pairwise distance of their executed
    position trajectories, (K, H, 10 G) -> mm, averaged over the grippers."""
    spreads = []
    for chunk in gripper_chunks(samples):
        pos = chunk[:, :n_action_steps, :3]
        k = len(pos)
        d = [np.linalg.norm(pos[i] - pos[j], axis=-1).mean() for i in range(k) for j in range(i + 1, k)]
        spreads.append(float(1000 * np.mean(d)) if d else 0.0)
    return float(np.mean(spreads)) if len(spreads) > 1 else spreads[0]


def bootstrap_mean_ci(
    values: np.ndarray, episodes: np.ndarray, seed: int, resamples: int = 2000, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of paired differences (N,), over the
    episodes (N,) and the samples within them (`hierarchical_bootstrap`)."""
    return percentile_ci(
        hierarchical_bootstrap({"x": {"v": values[None]}}, episodes, seed, resamples)["x"]["v"], level
    )


def constant_velocity(
    obs_pose: np.ndarray, obs_width: np.ndarray, horizon: int, width_range: tuple[float, float] | None = None
) -> np.ndarray:
    """(N, T, 10): the last observed motion continued, a baseline that needs no learning.

    obs_pose (N, O, 9) and obs_width (N, O, 1) are the observation window, O >= 2: step j is
    (O-1-j) periods 1/f before the anchor and its pose is relative to the anchor (the last step
    is the identity). Action step k is k+1 periods after the anchor. The motion from the
    previous observation to the anchor is a rigid transform D (the anchor's pose in the previous
    step's frame); repeating it as a constant body-frame twist gives step k = D^(k+1). The width
    continues linearly, clipped to `width_range` (the training widths) when given, and is
    returned as the change from the current width, as actions are.
    """
    if obs_pose.shape[1] < 2:
        raise ValueError(f"constant velocity needs at least 2 observation steps, got {obs_pose.shape[1]}")
    prev_rot = rot6d_to_matrix(obs_pose[:, -2, 3:9])  # (N, 3, 3): anchor <- previous step
    step_rot = np.swapaxes(prev_rot, -1, -2)  # previous <- anchor: one step's rotation in the body frame
    step_pos = -np.einsum("nij,nj->ni", step_rot, obs_pose[:, -2, :3])  # (N, 3)
    n = len(obs_pose)
    rot, pos = np.broadcast_to(np.eye(3), (n, 3, 3)), np.zeros((n, 3))
    chunk = np.empty((n, horizon, 10))
    for k in range(horizon):
        pos = pos + np.einsum("nij,nj->ni", rot, step_pos)
        rot = rot @ step_rot
        chunk[:, k, :3], chunk[:, k, 3:9] = pos, rot6d(rot)
    current, previous = obs_width[:, -1, 0], obs_width[:, -2, 0]
    width = current[:, None] + (current - previous)[:, None] * np.arange(1, horizon + 1)[None]
    chunk[..., 9] = (np.clip(width, *width_range) if width_range is not None else width) - current[:, None]
    return chunk


def joint_errors(
    predicted: np.ndarray, recorded: np.ndarray, gripper_dims: list[int]
) -> dict[str, np.ndarray]:
    """Joint-space chunks (N, H, D), absolute (`dataset.joint_windows`): per sample and horizon step
    (N, H), the mean absolute error over the arm joints and over the `gripper_dims` (a component
    without dimensions is left out), in the dataset's units."""
    diff = np.abs(predicted - recorded)
    arm = [d for d in range(diff.shape[-1]) if d not in gripper_dims]
    groups = {"joints": arm, "grippers": list(gripper_dims)}
    return {name: diff[..., dims].mean(axis=-1) for name, dims in groups.items() if dims}


def joint_hold_still(obs_state: np.ndarray, horizon: int) -> np.ndarray:
    """(N, H, D): the current joint vector (the last observation step) at every step."""
    return np.repeat(obs_state[:, -1:], horizon, axis=1)


def joint_constant_velocity(obs_state: np.ndarray, horizon: int) -> np.ndarray:
    """(N, H, D): the motion from the previous observation step to the current one continued, step k
    at k + 1 periods."""
    if obs_state.shape[1] < 2:
        raise ValueError(f"constant velocity needs at least 2 observation steps, got {obs_state.shape[1]}")
    current, velocity = obs_state[:, -1], obs_state[:, -1] - obs_state[:, -2]
    return current[:, None] + velocity[:, None] * np.arange(1, horizon + 1)[None, :, None]


def foreign_episode_partners(episodes: np.ndarray, seed: int) -> np.ndarray:
    """(N,) for each sample, the index of a sample of ANOTHER episode, seeded.

    A shuffle: the samples, grouped by episode (groups and members in random order), are
    shifted by the largest group's size, which moves every sample out of its own group as long
    as no episode holds more than half the samples. Otherwise no permutation can do it, and each
    sample draws a partner from the other episodes (with replacement).
    """
    episodes = np.asarray(episodes)
    labels, counts = np.unique(episodes, return_counts=True)
    if len(labels) < 2:
        raise ValueError(f"samples of another episode need at least 2 episodes, got {len(labels)}")
    rng = np.random.default_rng(seed)
    n = len(episodes)
    rank = dict(zip(labels.tolist(), rng.permutation(len(labels)).tolist()))
    order = rng.permutation(n)
    order = order[np.argsort([rank[e] for e in episodes[order].tolist()], kind="stable")]
    largest = int(counts.max())
    partners = np.empty(n, dtype=np.int64)
    if 2 * largest <= n:
        partners[order] = order[(np.arange(n) + largest) % n]
        return partners
    for label in labels:
        mine, others = np.flatnonzero(episodes == label), np.flatnonzero(episodes != label)
        partners[mine] = others[rng.integers(0, len(others), len(mine))]
    return partners


CI_METHOD = (
    "percentile bootstrap over seeds, then episodes, then samples within the drawn episodes; "
    "the same draws for every quantity, so comparisons stay paired"
)


def episode_sample_weights(episodes: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(R, N): how often each sample is drawn when a replicate draws the E episodes with
    replacement, then, for each drawn copy of an episode, as many of its samples as it holds
    with replacement.

    Samples of one episode are correlated (one target, one trajectory, touching windows): the
    episode, not the sample, is the unit that generalises, so it is the outer level.
    """
    labels, index = np.unique(np.asarray(episodes), return_inverse=True)
    e = len(labels)
    copies = rng.multinomial(e, np.full(e, 1 / e), size=resamples)  # (R, E)
    weights = np.zeros((resamples, len(index)))
    for label in range(e):
        members = np.flatnonzero(index == label)
        m = len(members)
        # c copies draw m samples each: together one draw of c * m samples from the episode's m.
        weights[:, members] = rng.multinomial(copies[:, label] * m, np.full(m, 1 / m))
    return weights


def hierarchical_bootstrap(
    groups: dict[str, dict[str, np.ndarray]], episodes: np.ndarray, seed: int, resamples: int = 2000
) -> dict[str, dict[str, np.ndarray]]:
    """Bootstrap replicates of grand means over seeds, episodes and samples: (R,) per quantity.

    `groups` maps a group (the seeds of one configuration, or the seed-free baselines) to its
    quantities, each (S, N): S seeds (trained policies) by N samples; `episodes` (N,) is each
    sample's episode. Each replicate draws the seeds of every group with replacement (the
    quantities of one group share the draw, so a policy stays paired with its own ablation), then
    the episodes and the samples within them (`episode_sample_weights`), the same draw for every
    quantity of every group (so comparisons stay paired); a replicate is the mean over the drawn
    seeds and samples. With S = 1 the seed draw is the identity, with one episode the episode draw.
    """
    sizes = {x.shape[1] for quantities in groups.values() for x in quantities.values()}
    if len(sizes) != 1:
        raise ValueError(f"every quantity must cover the same samples, got sample counts {sorted(sizes)}")
    (n,) = sizes
    if len(episodes) != n:
        raise ValueError(f"{len(episodes)} episode labels for {n} samples")
    rng = np.random.default_rng(seed)
    sample_weights = episode_sample_weights(episodes, rng, resamples)  # (R, N)
    drawn = sample_weights.sum(axis=1)  # (R,): samples in each replicate (episodes differ in size)
    out = {}
    for name in sorted(groups):
        seeds = {x.shape[0] for x in groups[name].values()}
        if len(seeds) != 1:
            raise ValueError(
                f"the quantities of {name!r} come from different numbers of seeds: {sorted(seeds)}"
            )
        (s,) = seeds
        seed_counts = rng.multinomial(s, np.full(s, 1 / s), size=resamples)  # (R, S)
        out[name] = {
            q: np.einsum("rs,sn,rn->r", seed_counts, x, sample_weights) / (s * drawn)
            for q, x in groups[name].items()
        }
    return out


def percentile_ci(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates."""
    lo, hi = np.percentile(replicates, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def best_baseline(executed_means: dict[str, float]) -> str:
    """The baseline with the lowest error (ties: the first name in sorted order)."""
    return min(sorted(executed_means), key=lambda name: executed_means[name])


def ci_scope(seeds: dict[str, int], episodes: int) -> str:
    """What a bootstrap CI over these groups' seeds and `episodes` episodes covers, in words for
    the report."""
    levels = "episodes, then samples within them" if episodes > 1 else "samples of the one episode only"
    if all(s == 1 for s in seeds.values()):
        counts = "one seed" + (" per side" if len(seeds) > 1 else "")
    else:
        levels = "seeds, " + levels
        counts = ", ".join(f"{name}: {s} seed{'s' * (s > 1)}" for name, s in seeds.items())
    return f"{levels} ({counts}; {episodes} episode{'s' * (episodes > 1)})"


def _mean_ci(replicates: np.ndarray, mean: float) -> dict[str, Any]:
    return {"mean": float(mean), "ci95": list(percentile_ci(replicates))}


def seeds_summary(
    policy: dict[str, np.ndarray],
    ablation: dict[str, np.ndarray] | None,
    baselines: dict[str, dict[str, np.ndarray]],
    episodes: np.ndarray,
    seed: int,
    resamples: int = 2000,
) -> dict[str, Any]:
    """Per component: the policy's error, each baseline's, the ratio to the best baseline and the
    camera ablation gap (ablation - policy), each as a mean with a 95% CI over seeds, episodes and
    samples (`hierarchical_bootstrap`).

    policy and ablation map a component to (S, N) executed errors (S seeds, the same N samples,
    the ablation of seed s from policy s); baselines map a name to {component: (N,)}; episodes
    (N,) is each sample's episode. The best
    baseline of a component is the one with the lowest mean, named in the result.
    """
    floor = 1e-12  # a baseline with zero error (e.g. a width that never changes) gives a huge ratio, not inf
    groups = {
        "policy": dict(policy),
        "baselines": {f"{b}/{c}": errs[c][None] for b, errs in baselines.items() for c in errs},
    }
    if ablation is not None:
        groups["policy"].update({f"ablation/{c}": x for c, x in ablation.items()})
    reps = hierarchical_bootstrap(groups, episodes, seed, resamples)
    out: dict[str, Any] = {}
    for c, x in policy.items():
        base_means = {b: float(errs[c].mean()) for b, errs in baselines.items()}
        entry: dict[str, Any] = {
            "policy": _mean_ci(reps["policy"][c], x.mean()),
            "baselines": {b: _mean_ci(reps["baselines"][f"{b}/{c}"], m) for b, m in base_means.items()},
        }
        if base_means:
            best = best_baseline(base_means)
            ratio = reps["policy"][c] / np.maximum(reps["baselines"][f"{best}/{c}"], floor)
            entry["best_baseline"] = best
            entry["ratio_to_best_baseline"] = _mean_ci(ratio, x.mean() / max(base_means[best], floor))
        if ablation is not None:
            gap = reps["policy"][f"ablation/{c}"] - reps["policy"][c]
            entry["camera_ablation_gap"] = _mean_ci(gap, ablation[c].mean() - x.mean())
        out[c] = entry
    return out


def difference_summary(
    a: dict[str, np.ndarray],
    b: dict[str, np.ndarray],
    episodes: np.ndarray,
    seed: int,
    resamples: int = 2000,
) -> dict[str, Any]:
    """Per component, B - A of the mean error with a 95% CI over both sides' seeds and the shared
    episodes and samples; a and b map a component to (S_a, N) and (S_b, N) errors on the same N
    samples, of the episodes (N,)."""
    reps = hierarchical_bootstrap({"A": a, "B": b}, episodes, seed, resamples)
    return {c: _mean_ci(reps["B"][c] - reps["A"][c], b[c].mean() - a[c].mean()) for c in a}


def moving_samples(
    recorded: np.ndarray, n_action_steps: int, position_mm: float, width_mm: float
) -> dict[str, np.ndarray]:
    """(N,) bool per component: where the recorded gripper moves over the executed steps.

    Position: the recorded position leaves the current one by more than `position_mm` at some
    executed step; width: the recorded width changes by more than `width_mm` from the current
    one at some executed step. Where it does not, holding still is nearly exact, and a mean over
    all samples mixes the two regimes.

    With several grippers (..., 10 G), a sample moves where any gripper does.
    """
    moving = {"position_mm": np.zeros(len(recorded), bool), "width_mm": np.zeros(len(recorded), bool)}
    for chunk in gripper_chunks(recorded):
        executed = chunk[:, :n_action_steps]
        moving["position_mm"] |= 1000 * np.linalg.norm(executed[..., :3], axis=-1).max(axis=1) > position_mm
        moving["width_mm"] |= 1000 * np.abs(executed[..., 9]).max(axis=1) > width_mm
    return moving
