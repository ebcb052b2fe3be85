"""Closed-loop success of a rig policy (two grippers, their wrist cameras and the scene camera) in
new rig scenes, beside the references: each gripper's own demonstration replayed, and holding still.

    python -m tests.benchmarks.measure_rig_rollout POLICY_FOLDER [--episodes 20] [--first-seed 0] [--out F]

Prints, per controller, the success rate with its Wilson 95% CI (an episode succeeds when every
gripper places its block), each gripper's own success rate and outcomes, and the seconds it took;
writes them as JSON with `--out`. Episodes run in two processes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from policypipe.rollout.episode import RolloutConfig
from policypipe.rollout.references import DemonstrationReplay, HoldStill
from policypipe.rollout.report import wilson_interval
from policypipe.rollout.rig import PerGripper, rig_rollout_scene, run_rig_episode

_runner = None


def _start(policy: str) -> None:
    global _runner
    import torch

    from policypipe.runtime.runner import PolicyRunner

    torch.set_num_threads(1)
    _runner = PolicyRunner.load(Path(policy))


def _episode(controller: str, seed: int, grippers: int) -> dict:
    config = RolloutConfig(frequency_hz=_runner.spec.frequency_hz)
    if controller == "policy":
        _runner.generator.manual_seed(1_000_003 + seed)
        chosen = _runner
    elif controller == "demonstrator":
        chosen = PerGripper(
            [DemonstrationReplay(p, config.frequency_hz) for p in rig_rollout_scene(seed, grippers).plans]
        )
    else:
        chosen = PerGripper([HoldStill(config.frequency_hz) for _ in range(grippers)])
    started = time.perf_counter()
    result = run_rig_episode(chosen, seed, config, grippers=grippers, scene_camera=True)
    return {
        "seed": seed,
        "outcome": result.outcome,
        "outcomes": list(result.gripper_outcomes),
        "duration_s": result.duration_s,
        "wall_s": time.perf_counter() - started,
    }


def summary(episodes: list[dict], grippers: int) -> dict:
    n = len(episodes)
    wins = sum(e["outcome"] == "success" for e in episodes)
    low, high = wilson_interval(wins, n)
    per_gripper = {}
    for g in range(grippers):
        own = Counter(e["outcomes"][g] for e in episodes)
        g_low, g_high = wilson_interval(own["success"], n)
        per_gripper[f"robot{g}"] = {
            "success_rate": own["success"] / n,
            "ci95": [g_low, g_high],
            "outcomes": dict(sorted(own.items())),
        }
    return {
        "episodes": n,
        "success_rate": wins / n,
        "ci95": [low, high],
        "outcomes": dict(sorted(Counter(e["outcome"] for e in episodes).items())),
        "per_gripper": per_gripper,
        "episode_wall_s_mean": sum(e["wall_s"] for e in episodes) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", type=Path)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from policypipe.runtime.spec import RuntimeSpec

    spec = RuntimeSpec.read(args.policy)
    grippers = len(spec.grippers)
    if spec.cameras != tuple(range(grippers + 1)):
        raise SystemExit(
            f"{args.policy} takes cameras {list(spec.cameras)}: the rig has a wrist camera per gripper "
            "and a scene camera"
        )
    seeds = range(args.first_seed, args.first_seed + args.episodes)
    report = {"policy": str(args.policy), "seeds": [seeds.start, seeds.stop - 1]}
    with ProcessPoolExecutor(2, initializer=_start, initargs=(str(args.policy),)) as pool:
        for controller in ("demonstrator", "hold_still", "policy"):
            started = time.perf_counter()
            episodes = list(pool.map(_episode, [controller] * len(seeds), seeds, [grippers] * len(seeds)))
            report[controller] = summary(episodes, grippers) | {"wall_s": time.perf_counter() - started}
            r = report[controller]
            print(
                f"{controller}: {100 * r['success_rate']:.0f} % "
                f"[{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}] "
                f"of {r['episodes']} ({r['outcomes']}); per gripper "
                + ", ".join(
                    f"{g} {100 * v['success_rate']:.0f} % {v['outcomes']}"
                    for g, v in r["per_gripper"].items()
                )
                + f"; {r['wall_s']:.0f} s",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
