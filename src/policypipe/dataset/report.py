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


def write_plots(root: zarr.Group, out_dir: Path, split: dict) -> list[Path]:
    """Episode lengths and top-down paths (held-out episodes dashed: validation, dotted: test)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ends = root[layout.EPISODE_ENDS][:]
    first, last = episode_bounds(ends)
    stems = [ep["stem"] for ep in root.attrs[layout.ATTRS_EPISODES]]
    pos = root[layout.EEF_POS][:]
    width = root[layout.GRIPPER_WIDTH][:, 0]
    stamps = root[layout.TIMESTAMP][:]
    frequency = float(root.attrs[layout.ATTRS_FREQUENCY])
    colors = plt.cm.viridis(np.linspace(0, 1, len(ends)))
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(
        (last - first + 1) / frequency, bins=min(30, max(5, len(ends))), color="tab:blue", edgecolor="white"
    )
    ax.set(
        xlabel="episode length (s)", ylabel="episodes", title=f"{len(ends)} episodes at {frequency:.1f} Hz"
    )
    written.append(save_png(fig, out_dir / "episode_lengths.png", dpi=110))

    fig, ax = plt.subplots(figsize=(6, 6))
    line_style = {e: "--" for e in split["val"]} | {e: ":" for e in split.get("test", [])}
    for e in range(len(ends)):
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
    written.append(save_png(fig, out_dir / "paths_topdown.png", dpi=110))

    fig, ax = plt.subplots(figsize=(7, 4))
    for e in range(len(ends)):
        sl = slice(first[e], last[e] + 1)
        ax.plot(stamps[sl], 1000 * width[sl], color=colors[e], lw=1)
    ax.set(xlabel="time in episode (s)", ylabel="gripper width (mm)", title="gripper width over time")
    written.append(save_png(fig, out_dir / "gripper_width.png", dpi=110))

    middle = (first + last) // 2
    frames = root[layout.RGB].get_orthogonal_selection((middle,))
    cols = int(np.ceil(np.sqrt(len(ends))))
    rows = int(np.ceil(len(ends) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.75 * rows), squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if i < len(ends):
            ax.imshow(frames[i])
            ax.set_title(stems[i], fontsize=6)
    fig.suptitle("middle frame of every episode", fontsize=9)
    written.append(save_png(fig, out_dir / "contact_sheet.png", dpi=110))
    return written
