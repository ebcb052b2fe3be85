"""The dataset's identity card (metrics/dataset.json) and the plots a person checks it with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr

from policypipe.dataset import layout
from policypipe.dataset.windows import episode_bounds
from policypipe.plotting import plt, save_png


def dataset_report(root: zarr.Group, fingerprint: str, split: dict[str, Any]) -> dict[str, Any]:
    ends = root[layout.EPISODE_ENDS][:]
    lengths = np.diff(np.concatenate([[0], ends]))
    frequency = float(root.attrs[layout.ATTRS_FREQUENCY])
    stamps = root[layout.TIMESTAMP][:]
    first, last = episode_bounds(ends)
    # An episode lasts from its first to its last frame, plus the last frame's own interval.
    duration = float(np.sum(stamps[last] - stamps[first]) + len(ends) / frequency)
    return {
        "episodes": int(len(ends)),
        "frames": int(ends[-1]),
        "duration_s": round(duration, 3),
        "frequency_hz": frequency,
        "image_size": list(root.attrs[layout.ATTRS_IMAGE_SIZE]),
        "episode_length_frames": {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "max": int(lengths.max()),
        },
        "train_episodes": len(split["train"]),
        "val_episodes": len(split["val"]),
        "test_episodes": len(split.get("test", [])),
        "fingerprint": fingerprint,
    }


# Episodes the contact sheet shows at most: a thumbnail each, so the sheet grows with them (11 MB
# for the demo's 480, a file git keeps); beyond this many, evenly spread ones.
CONTACT_SHEET_EPISODES = 100


def contact_sheet_episodes(count: int) -> np.ndarray:
    """The episodes the contact sheet shows: all of `count`, or CONTACT_SHEET_EPISODES evenly spread
    from the first to the last."""
    return np.unique(np.linspace(0, count - 1, min(count, CONTACT_SHEET_EPISODES)).round().astype(int))


def write_plots(root: zarr.Group, out_dir: Path, split: dict) -> list[Path]:
    """Episode lengths, what moved (top-down gripper paths and widths, held-out episodes dashed:
    validation, dotted: test; or a joint-space dataset's joints over time) and a contact sheet."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ends = root[layout.EPISODE_ENDS][:]
    first, last = episode_bounds(ends)
    stamps = root[layout.TIMESTAMP][:]
    frequency = float(root.attrs[layout.ATTRS_FREQUENCY])
    colors = plt.cm.viridis(np.linspace(0, 1, len(ends)))
    line_style = {e: "--" for e in split["val"]} | {e: ":" for e in split.get("test", [])}
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(
        (last - first + 1) / frequency, bins=min(30, max(5, len(ends))), color="tab:blue", edgecolor="white"
    )
    ax.set(
        xlabel="episode length (s)", ylabel="episodes", title=f"{len(ends)} episodes at {frequency:.1f} Hz"
    )
    written.append(save_png(fig, out_dir / "episode_lengths.png", dpi=110))

    if layout.is_joint_space(root.attrs):
        written.append(_joint_plot(root, out_dir, first, last, stamps, colors, line_style))
    else:
        written += _pose_plots(root, out_dir, first, last, stamps, colors, line_style)

    stems = [ep["stem"] for ep in root.attrs[layout.ATTRS_EPISODES]]
    shown = contact_sheet_episodes(len(ends))
    frames = root[layout.RGB].get_orthogonal_selection(((first[shown] + last[shown]) // 2,))
    cols = int(np.ceil(np.sqrt(len(shown))))
    rows = int(np.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.75 * rows), squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if i < len(shown):
            ax.imshow(frames[i])
            ax.set_title(stems[shown[i]], fontsize=6)
    some = f"{len(shown)} of {len(ends)} episodes, evenly spread"
    fig.suptitle(f"middle frame of {some if len(shown) < len(ends) else 'every episode'}", fontsize=9)
    written.append(save_png(fig, out_dir / "contact_sheet.png", dpi=110))
    return written


def _pose_plots(root, out_dir, first, last, stamps, colors, line_style) -> list[Path]:
    """Gripper 0's top-down paths and its width over time."""
    pos = root[layout.EEF_POS][:]
    width = root[layout.GRIPPER_WIDTH][:, 0]
    fig, ax = plt.subplots(figsize=(6, 6))
    for e in range(len(first)):
        p = pos[first[e] : last[e] + 1]
        ax.plot(p[:, 0], p[:, 1], color=colors[e], lw=1, ls=line_style.get(e, "-"))
        ax.plot(p[0, 0], p[0, 1], "o", color=colors[e], ms=3)
        ax.plot(p[-1, 0], p[-1, 1], "x", color=colors[e], ms=4)
    ax.set(
        xlabel="x (m)",
        ylabel="y (m)",
        title="gripper paths, top-down (o start, x end; dashed: validation, dotted: test)",
    )
    ax.set_aspect("equal", adjustable="datalim")
    written = [save_png(fig, out_dir / "paths_topdown.png", dpi=110)]

    fig, ax = plt.subplots(figsize=(7, 4))
    for e in range(len(first)):
        sl = slice(first[e], last[e] + 1)
        ax.plot(stamps[sl], 1000 * width[sl], color=colors[e], lw=1)
    ax.set(xlabel="time in episode (s)", ylabel="gripper width (mm)", title="gripper width over time")
    written.append(save_png(fig, out_dir / "gripper_width.png", dpi=110))
    return written


def _joint_plot(root, out_dir, first, last, stamps, colors, line_style) -> Path:
    """Every joint's position over time, one panel per joint, one line per episode."""
    state = root[layout.JOINT_STATE][:]
    names = list(root.attrs[layout.ATTRS_JOINT_NAMES])
    cols = min(len(names), 7)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.0 * rows), squeeze=False, sharex=True)
    for d, ax in enumerate(axes.ravel()):
        if d >= len(names):
            ax.axis("off")
            continue
        for e in range(len(first)):
            sl = slice(first[e], last[e] + 1)
            ax.plot(stamps[sl], state[sl, d], color=colors[e], lw=0.8, ls=line_style.get(e, "-"))
        ax.set_title(names[d], fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle("joint positions over time (dashed: validation, dotted: test)", fontsize=9)
    return save_png(fig, out_dir / "joint_positions.png", dpi=110)
