"""The learning curve's plot for the docs: success and grasp rate (Wilson 95 % intervals) against
samples seen, one line per `bench_learning_curve` run (its curve.json), with a second axis for the
minutes of 2-core CPU training each point took.

    python -m tests.benchmarks.plot_learning_curve docs/learning_curve.png \\
        --curve "demo model, batch 32, 96 px" runs/curve-demo-o1/curve.json \\
        --curve "64 px, batch 128" runs/curve-small/curve.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from policypipe.plotting import plt, save_png
from policypipe.rollout.report import wilson_interval


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--curve", nargs=2, action="append", required=True, metavar=("NAME", "CURVE_JSON"))
    args = parser.parse_args()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for (name, path), marker in zip(args.curve, "os^Dv"):
        curve = json.loads(Path(path).read_text())
        points = sorted(curve["points"].values(), key=lambda p: (p["samples"], p["seed"]))
        samples = np.array([p["samples"] for p in points])
        episodes = [sum(p["outcomes"].values()) for p in points]
        for ax, key in zip(axes, ("success_rate", "grasp_rate")):
            rate = np.array([p[key] for p in points])
            ci = np.array([wilson_interval(round(r * n), n) for r, n in zip(rate, episodes)])
            ax.errorbar(
                samples, rate, yerr=[rate - ci[:, 0], ci[:, 1] - rate], marker=marker, capsize=3, label=name
            )
            for x, y, p in zip(samples, rate, points):
                ax.annotate(
                    f"{p['train_s'] / 60:.0f} min",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
    for ax, title in zip(axes, ("success", "grasped the block")):
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("training samples seen (labels: minutes of 2-core CPU training)")
        ax.set_title(f"{title}, scenes {curve['scenes'][0]}-{curve['scenes'][1]}, Wilson 95 %")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_png(fig, args.out)


if __name__ == "__main__":
    main()
