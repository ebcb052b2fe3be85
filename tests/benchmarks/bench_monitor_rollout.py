"""The runtime monitor in closed loop over several training seeds (docs/rollout.md, "Does the monitor
see the failures coming?"): each policy's episodes and the scene's demonstration replayed (the
monitor in the shadow) on one range of scenes, the rollout stage's figures per seed
(`rollout.monitoring.assess`) and over all seeds' episodes pooled, and one JSON line per episode.

    python -m tests.benchmarks.calibrate_monitor runs/plain/seed0/policy runs/plain/seed0/monitored
    python -m tests.benchmarks.bench_monitor_rollout --first-seed 0 --episodes 50 \
        --policies runs/plain/seed*/monitored --out monitor.json --episodes-out monitor_episodes.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from policypipe.monitor.scores import Calibration
from policypipe.rollout.monitoring import MONITORS, alarm_times, assess, episode_maximum, monitor_figures
from policypipe.rollout.report import RolloutStageConfig, run_rollouts

CONTROLLERS = ("policy", "demonstration_replay")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policies", type=Path, nargs="+", required=True, help="calibrated policy folders")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--episodes-out", type=Path, required=True, help="one JSON line per episode")
    args = parser.parse_args()
    stage = RolloutStageConfig(episodes=args.episodes, first_seed=args.first_seed, videos=0)
    results: dict = {"scenes": [args.first_seed, args.first_seed + args.episodes - 1], "policies": {}}
    pooled: dict[str, list] = {c: [] for c in CONTROLLERS}
    alarms: dict[int, dict] = {}
    lines = []
    for folder in args.policies:
        calibration = Calibration.read(folder)
        if calibration is None:
            parser.error(f"{folder} has no calibration: make one with tests.benchmarks.calibrate_monitor")
        started = time.monotonic()
        episodes = run_rollouts(folder, stage, args.workers, [[]], controllers=CONTROLLERS)
        figures = assess(episodes["policy"], episodes["demonstration_replay"], calibration)
        figures["seconds"] = round(time.monotonic() - started, 1)
        results["policies"][str(folder)] = figures
        for controller in CONTROLLERS:
            pooled[controller] += episodes[controller]
            for r in episodes[controller]:
                alarms[id(r)] = alarm_times(r.monitor, calibration)
                maxima = {s: episode_maximum(r.monitor, s) for s in ("novelty", "inconsistency", "score")}
                lines.append(
                    {"policy": str(folder), "controller": controller, "seed": r.seed, "outcome": r.outcome}
                    | {"duration_s": r.duration_s, "chunks": len(r.monitor), "first_alarm_s": alarms[id(r)]}
                    | {"maximum": maxima}
                )
        print(f"{folder}: {_line(figures)}", flush=True)
        args.episodes_out.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    # Every seed's episodes pooled, each judged by its own policy's calibration.
    results["pooled"] = monitor_figures(pooled["policy"], pooled["demonstration_replay"], alarms)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"pooled over {len(args.policies)} seeds: {_line(results['pooled'])}")


def _line(figures: dict) -> str:
    def counted(share: dict) -> str:
        return f"{share['count']}/{share['of']}"

    return "; ".join(
        f"{m}: detected {counted(figures[m]['detected_failures'])}, "
        f"false {counted(figures[m]['false_alarms_demonstration_replay'])} replays, "
        f"AUROC {figures[m]['auroc_failed_vs_demonstration_replay']}"
        for m in MONITORS
    )


if __name__ == "__main__":
    main()
