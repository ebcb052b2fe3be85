"""Pictures a person checks a policy with: predicted against recorded paths and widths (or, in
joint space, commands)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.windows import WindowConfig, episode_bounds
from policypipe.evaluation.samples import Samples
from policypipe.plotting import plt, save_png

LABELS = {
    "policy": "policy",
    "camera_ablation_other_episodes": "policy, frames of another episode",
    "camera_ablation_constant_image": "policy, constant image",
    "constant_velocity": "constant velocity",
    "nearest_neighbour": "nearest neighbour",
    "mean_motion": "mean motion",
    "hold_still": "hold still",
}
# Drawn over the recorded paths: the policy, what it does without its own frames, and the best
# simple guesses, one continuing the motion, one copying the nearest training windows (colour, line style).
PATHS = {
    "policy": ("tab:blue", "-"),
    "camera_ablation_other_episodes": ("tab:red", "-"),
    "constant_velocity": ("tab:green", "--"),
    "nearest_neighbour": ("tab:purple", ":"),
}


def write_eval_plots(
    store: Path,
    samples: Samples,
    chunks: dict[str, np.ndarray],
    per_step: list[dict],
    out_dir: Path,
    n_action_steps: int,
    episodes: int,
    side: str = "held-out episodes",
) -> list[Path]:
    """Predicted against recorded chunks for `episodes` episodes of the samples (of `side`, named in
    the titles) and the error along the horizon."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(store, mode="r")
    pos = root[layout.EEF_POS][:].astype(np.float64)
    rot = Rotation.from_rotvec(root[layout.EEF_ROT][:].astype(np.float64)).as_matrix()
    width = root[layout.GRIPPER_WIDTH][:, 0]
    stamps = root[layout.TIMESTAMP][:]
    frequency = float(root.attrs[layout.ATTRS_FREQUENCY])
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    shown = list(dict.fromkeys(samples.episodes.tolist()))[:episodes]
    written = []

    fig, axes = plt.subplots(2, len(shown), figsize=(4.2 * len(shown), 7.5), squeeze=False)
    for col, e in enumerate(shown):
        top, bottom = axes[0, col], axes[1, col]
        span = slice(first[e], last[e] + 1)
        top.plot(pos[span, 0], pos[span, 1], color="0.6", lw=2, label="recorded")
        bottom.plot(stamps[span], 1000 * width[span], color="0.6", lw=2, label="recorded")
        for i in np.flatnonzero(samples.episodes == e):
            a = samples.anchors[i]
            for name, (color, style) in PATHS.items():
                if name not in chunks:
                    continue
                chunk = chunks[name][i]
                world = pos[a] + chunk[:, :3] @ rot[a].T  # relative positions back to the world frame
                top.plot(
                    world[:n_action_steps, 0],
                    world[:n_action_steps, 1],
                    color=color,
                    ls=style,
                    lw=1,
                    alpha=0.8,
                )
                t = stamps[a] + WindowConfig(
                    horizon=len(chunk), n_action_steps=n_action_steps
                ).action_offsets(frequency)
                # Action widths are changes from the anchor's width.
                bottom.plot(
                    t[:n_action_steps],
                    1000 * (width[a] + chunk[:n_action_steps, 9]),
                    color=color,
                    ls=style,
                    lw=1,
                    alpha=0.8,
                )
        top.set(title=f"episode {e}: top-down (m)", xlabel="x", ylabel="y")
        top.set_aspect("equal", adjustable="datalim")
        bottom.set(xlabel="time in episode (s)", ylabel="gripper width (mm)")
    for name, (color, style) in PATHS.items():
        if name in chunks:
            axes[0, 0].plot([], [], color=color, ls=style, label=LABELS[name] + " (executed steps)")
    axes[0, 0].legend(fontsize=7, loc="best")
    fig.suptitle(f"predicted action chunks against the recorded future, {side}")
    written.append(save_png(fig, out_dir / "predicted_vs_recorded.png", dpi=100))

    written.append(_error_along_horizon(per_step, out_dir, n_action_steps, side, "position error (mm)"))
    return written


def write_joint_eval_plots(
    store: Path,
    samples: Samples,
    chunks: dict[str, np.ndarray],
    per_step: list[dict],
    out_dir: Path,
    n_action_steps: int,
    side: str = "held-out episodes",
) -> list[Path]:
    """A joint-space policy (`evaluation.joint_space`): for the first episode of the samples, every
    joint's recorded commands with the executed steps of the policy's and the best simple guesses'
    chunks drawn over them, and the arm joints' error along the horizon."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(store, mode="r")
    commands = root[layout.JOINT_ACTION][:]
    names = list(root.attrs[layout.ATTRS_JOINT_NAMES])
    stamps = root[layout.TIMESTAMP][:]
    frequency = float(root.attrs[layout.ATTRS_FREQUENCY])
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    e = int(samples.episodes[0])
    span = slice(first[e], last[e] + 1)
    cols = min(len(names), 7)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.2 * rows), squeeze=False, sharex=True)
    horizon = next(iter(chunks.values())).shape[1]
    offsets = WindowConfig(horizon=horizon, n_action_steps=n_action_steps).command_offsets(frequency)
    for d, ax in enumerate(axes.ravel()):
        if d >= len(names):
            ax.axis("off")
            continue
        ax.plot(stamps[span], commands[span, d], color="0.6", lw=2)
        for i in np.flatnonzero(samples.episodes == e):
            t = stamps[samples.anchors[i]] + offsets[:n_action_steps]
            for name, (color, style) in PATHS.items():
                if name in chunks:
                    ax.plot(t, chunks[name][i, :n_action_steps, d], color=color, ls=style, lw=1, alpha=0.8)
        ax.set_title(names[d], fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0, 0].plot([], [], color="0.6", lw=2, label="recorded command")
    for name, (color, style) in PATHS.items():
        if name in chunks:
            axes[0, 0].plot([], [], color=color, ls=style, label=LABELS[name] + " (executed steps)")
    axes[0, 0].legend(fontsize=6, loc="best")
    fig.suptitle(f"predicted commands against the recorded ones, episode {e} of the {side}", fontsize=9)
    written = [save_png(fig, out_dir / "predicted_vs_recorded.png", dpi=100)]

    written.append(
        _error_along_horizon(per_step, out_dir, n_action_steps, side, "arm joint error (dataset units)")
    )
    return written


def _error_along_horizon(
    per_step: list[dict], out_dir: Path, n_action_steps: int, side: str, ylabel: str
) -> Path:
    """The policy's and every baseline's mean error at each horizon step."""
    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [row["step"] for row in per_step]
    for name in LABELS:
        if name in per_step[0]:
            ax.plot(steps, [row[name] for row in per_step], marker="o", ms=3, label=LABELS[name])
    ax.axvline(n_action_steps + 0.5, color="0.7", ls="--", lw=1)
    ax.set(xlabel="horizon step", ylabel=ylabel, title=f"error along the horizon, {side} (dashed: executed)")
    ax.legend(fontsize=8)
    return save_png(fig, out_dir / "error_vs_horizon.png", dpi=100)
