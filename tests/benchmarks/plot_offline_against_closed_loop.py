"""Does the offline number predict closed-loop success? One point per trained policy: its executed
position error on its dataset's test side (`policypipe compare POLICY --held-out test --json`,
written beside the policy folder as compare_test.json) against its success rate over the scenes
of a `bench_rollout_success` run, with the Wilson 95% interval. Writes a PNG for the docs.

    python -m tests.benchmarks.plot_offline_against_closed_loop success.json docs/offline_vs_success.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from policypipe.plotting import plt, save_png


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rollout", type=Path, help="bench_rollout_success's --out")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    results = json.loads(args.rollout.read_text())
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    rows = []
    for (name, config), marker in zip(results["configs"].items(), "os^Dv"):
        x, y, low, high = [], [], [], []
        for policy, outcome in config["policies"].items():
            compare = json.loads((Path(policy).parent / "compare_test.json").read_text())
            x.append(compare["sides"]["A"]["components"]["position_mm"]["policy"]["mean"])
            y.append(100 * outcome["success_rate"])
            low.append(100 * outcome["wilson_ci95"][0])
            high.append(100 * outcome["wilson_ci95"][1])
            rows.append((name, policy, x[-1], y[-1]))
        yerr = np.array([np.subtract(y, low), np.subtract(high, y)])
        ax.errorbar(x, y, yerr=yerr, fmt=marker, capsize=3, label=f"{name} ({len(x)} seeds)")
    ax.set_xlabel("executed position error on the test side, mm (offline)")
    ax.set_ylabel(f"success, % of scenes {results['scenes'][0]}-{results['scenes'][1]} (closed loop)")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, args.out, dpi=110)
    xs, ys = np.array([r[2] for r in rows]), np.array([r[3] for r in rows])
    if len(rows) > 2:
        r = np.corrcoef(xs, ys)[0, 1]
        print(f"Pearson r between offline error and success over {len(rows)} policies: {r:.2f}")
    for row in rows:
        print(f"{row[0]} {row[1]}: {row[2]:.2f} mm, {row[3]:.0f} %")


if __name__ == "__main__":
    main()
