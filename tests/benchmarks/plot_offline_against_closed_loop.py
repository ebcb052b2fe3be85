"""Does the offline number predict closed-loop success? One point per trained policy: its executed
position error on its dataset's test side (`policypipe compare POLICY --held-out test --json`,
written beside the policy folder as compare_test.json) against its success rate and its grasp rate
(episodes that gripped the block at least once) over the scenes of a `bench_rollout_success` run,
with Wilson 95% intervals. Writes a PNG for the docs.

    python -m tests.benchmarks.plot_offline_against_closed_loop success.json docs/offline_vs_success.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from policypipe.plotting import plt, save_png
from policypipe.rollout.report import UNGRASPED, wilson_interval


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rollout", type=Path, help="bench_rollout_success's --out")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    results = json.loads(args.rollout.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    rows = []
    for (name, config), marker in zip(results["configs"].items(), "os^Dv"):
        points = []
        for policy, outcome in config["policies"].items():
            compare = json.loads((Path(policy).parent / "compare_test.json").read_text())
            error = compare["sides"]["A"]["components"]["position_mm"]["policy"]["mean"]
            n = sum(outcome["outcomes"].values())
            successes = outcome["outcomes"]["success"]
            grasps = sum(k for o, k in outcome["outcomes"].items() if o not in UNGRASPED)
            points.append((error, successes, grasps, n))
            rows.append((name, policy, error, successes / n, grasps / n))
        for ax, column in zip(axes, (1, 2)):
            y = np.array([100 * p[column] / p[3] for p in points])
            bounds = 100 * np.array([wilson_interval(p[column], p[3]) for p in points])
            ax.errorbar(
                [p[0] for p in points],
                y,
                yerr=[y - bounds[:, 0], bounds[:, 1] - y],
                fmt=marker,
                capsize=3,
                label=f"{name} ({len(points)} seed{'s' * (len(points) > 1)})",
            )
    scenes = f"scenes {results['scenes'][0]}-{results['scenes'][1]}"
    for ax, what in zip(axes, ("success", "grasped the block")):
        ax.set_xlabel("executed position error on the test side, mm (offline)")
        ax.set_ylabel(f"{what}, % of the episodes")
        ax.set_title(f"closed loop, {scenes}", fontsize=9)
        ax.set_ylim(-2, 75)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    save_png(fig, args.out, dpi=100)
    errors, grasped = np.array([r[2] for r in rows]), np.array([r[4] for r in rows])
    if len(rows) > 2:
        r = np.corrcoef(errors, grasped)[0, 1]
        print(f"Pearson r between offline error and grasp rate over {len(rows)} policies: {r:.2f}")
    for name, policy, error, success, grasp in rows:
        print(f"{name} {policy}: {error:.2f} mm, success {success:.0%}, grasped {grasp:.0%}")


if __name__ == "__main__":
    main()
