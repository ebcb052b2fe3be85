"""Closed-loop success of configurations trained with several seeds, on one range of rollout scenes
(docs/rollout.md, "Measured"): each policy's episodes on the same scenes, then the configuration's
success rate, the mean over its seeds, with a 95% percentile-bootstrap CI over seeds and scenes
(`hierarchical_bootstrap`, the scenes shared by all seeds, as `policypipe compare` does for errors).

    python -m tests.benchmarks.bench_rollout_success --first-seed 1000 --episodes 50 \\
        --config plain runs/plain/seed*/policy --config recovery runs/recovery/seed*/policy

Choose on one range of scenes and report on another: the rollout stage's default range is 0-49,
so choices here are made on scenes from 1000 on. Only the policies run (the references do not
depend on them: the rollout stage reports those).

Seeds measured one at a time (each as its training ends) are pooled into one configuration from
their files, every episode's outcome kept there, without running them again:

    python -m tests.benchmarks.bench_rollout_success --pool plain seed0.json seed1.json seed2.json \
        --out plain.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from policypipe.evaluation.errors import hierarchical_bootstrap, percentile_ci
from policypipe.rollout.report import UNGRASPED, RolloutStageConfig, run_rollouts, summary, wilson_interval
from policypipe.synthetic.simulator import OUTCOMES


def success_ci_over_seeds_and_scenes(successes: np.ndarray) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the mean success over seeds, then scenes: `successes` is
    (seeds, scenes), 1.0 for a success, every seed on the same scenes."""
    replicates = hierarchical_bootstrap({"s": {"s": successes}}, np.arange(successes.shape[1]), seed=0)
    return percentile_ci(replicates["s"]["s"])


# What the episodes ran under: files pooled into one configuration must agree on all of it.
SETTINGS = ("scenes", "latency_ms", "compensate_latency", "hold_grip", "max_speed_m_s")


def configuration(policies: dict[str, dict]) -> dict:
    """One configuration's result from its policies' (one per training seed) `scene_outcomes`, every
    policy on the same scenes: the mean success over seeds, its CI over seeds and scenes, the pooled
    Wilson interval and the share of episodes that grasped the block."""
    outcomes = [entry["scene_outcomes"] for entry in policies.values()]
    matrix = np.array(
        [[o == "success" for o in row] for row in outcomes], dtype=np.float64
    )  # (seeds, scenes)
    low, high = success_ci_over_seeds_and_scenes(matrix)
    # All episodes pooled: no seed variation, but unlike the bootstrap not stuck at [0, 0] (or
    # [1, 1]) when no episode (or every one) succeeds.
    pooled = wilson_interval(int(matrix.sum()), matrix.size)
    return {
        "success_rate": float(matrix.mean()),
        "ci95": [low, high],
        "ci_method": f"percentile bootstrap over {len(policies)} seeds, then {matrix.shape[1]} scenes",
        "pooled_wilson_ci95": list(pooled),
        "grasped": float(np.mean([o not in UNGRASPED for row in outcomes for o in row])),
        "policies": policies,
    }


def pool(files: list[Path]) -> tuple[dict, dict]:
    """(the settings, the policies) of result files written one seed at a time, refused in words
    where they ran under other settings or predate `scene_outcomes`."""
    settings, policies = None, {}
    for path in files:
        results = json.loads(path.read_text())
        ran_under = {k: results[k] for k in SETTINGS}
        if settings is None:
            settings = ran_under
        elif ran_under != settings:
            raise SystemExit(
                f"{path}: ran under {ran_under}, {files[0]} under {settings}: pool like with like"
            )
        for config in results["configs"].values():
            for policy, entry in config["policies"].items():
                if "scene_outcomes" not in entry:
                    raise SystemExit(f"{path}: {policy} has no scene_outcomes (an older file): run it again")
                if policy in policies:
                    raise SystemExit(f"{path}: {policy} is in two of the files")
                policies[policy] = entry
    return settings, policies


def report(name: str, result: dict) -> None:
    low, high = result["ci95"]
    pooled = result["pooled_wilson_ci95"]
    print(
        f"{name}: {result['success_rate']:.1%} [{low:.1%}, {high:.1%}] over {len(result['policies'])} seeds "
        f"(pooled Wilson [{pooled[0]:.1%}, {pooled[1]:.1%}]); grasped the block in "
        f"{result['grasped']:.0%} of the episodes",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    runs = parser.add_mutually_exclusive_group(required=True)
    runs.add_argument("--config", nargs="+", action="append", metavar=("NAME", "POLICY"))
    runs.add_argument(
        "--pool",
        nargs="+",
        metavar=("NAME", "RESULTS"),
        help="one configuration from result files of its seeds",
    )
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="as rollout.latency_ms")
    parser.add_argument(
        "--compensate-latency",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as rollout.compensate_latency",
    )
    parser.add_argument(
        "--hold-grip", action=argparse.BooleanOptionalAction, default=True, help="as rollout.hold_grip"
    )
    parser.add_argument("--max-speed", type=float, default=None, help="as rollout.max_speed_m_s (m/s)")
    parser.add_argument("--out", type=Path, help="the results as JSON")
    args = parser.parse_args()
    if args.pool:
        name, *files = args.pool
        if not files:
            parser.error(f"--pool {name}: name the result files of its seeds after the name")
        settings, policies = pool([Path(f) for f in files])
        results = {**settings, "configs": {name: configuration(policies)}}
        report(name, results["configs"][name])
        if args.out:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
        return
    stage = RolloutStageConfig(
        episodes=args.episodes,
        first_seed=args.first_seed,
        videos=0,
        latency_ms=args.latency_ms,
        compensate_latency=args.compensate_latency,
        hold_grip=args.hold_grip,
        max_speed_m_s=args.max_speed,
    )
    results: dict = {
        "scenes": [args.first_seed, args.first_seed + args.episodes - 1],
        "latency_ms": args.latency_ms,
        "compensate_latency": args.compensate_latency,
        "hold_grip": args.hold_grip,
        "max_speed_m_s": args.max_speed,
        "configs": {},
    }
    for name, *policies in args.config:
        per_policy = {}
        for policy in policies:
            started = time.monotonic()
            episodes = run_rollouts(Path(policy), stage, args.workers, [], controllers=("policy",))["policy"]
            won = np.array([r.outcome == "success" for r in episodes], dtype=np.float64)
            low, high = wilson_interval(int(won.sum()), len(won))
            why = summary(episodes)
            per_policy[policy] = {
                "success_rate": float(won.mean()),
                "wilson_ci95": [low, high],
                "outcomes": {o: sum(r.outcome == o for r in episodes) for o in OUTCOMES},
                # Why the failures failed, as the rollout stage reports them.
                "missed_closes_failed": why["missed_closes"]["failed"],
                "drops": why["drops"],
                "seconds": round(time.monotonic() - started, 1),
                # Each scene's outcome, in the scenes' order: what pooling seeds run apart needs.
                "scene_outcomes": [r.outcome for r in episodes],
            }
            shown = {k: v for k, v in per_policy[policy].items() if k != "scene_outcomes"}
            print(f"{name} {policy}: {won.mean():.0%} [{low:.0%}, {high:.0%}] {shown}", flush=True)
        results["configs"][name] = configuration(per_policy)
        report(name, results["configs"][name])
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
