"""A copy of an exported policy that executes another number of each chunk's steps, to measure in
closed loop how much of a chunk to execute before the next request without training again
(docs/rollout.md, "How much of each chunk to execute"):

    python -m tests.benchmarks.execute_steps runs/near/seed0/policy runs/act12/seed0/policy 12
    python -m tests.benchmarks.bench_rollout_success --config act12 runs/act12/seed*/policy

The same weights and runtime spec, with `n_action_steps` (1 to the horizon) in both the config and
runtime.json, and the trained value in the copy's lineage (`n_action_steps_trained`). The monitor's
calibration is left out: its thresholds hold for chunks at the trained schedule.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy, save_policy


def executing(source: Path, target: Path, steps: int) -> Path:
    """`source`'s policy executing `steps` steps of each chunk, saved as `target`."""
    policy = load_policy(source)
    other = DiffusionPolicy(replace(policy.config, n_action_steps=steps))  # checks 1 <= steps <= horizon
    other.load_state_dict(policy.state_dict())
    runtime = json.loads((source / "runtime.json").read_text()) | {"n_action_steps": steps}
    lineage = json.loads((source / "manifest.json").read_text()).get("lineage", {})
    lineage = lineage | {"n_action_steps_trained": policy.config.n_action_steps, "copied_from": str(source)}
    return save_policy(target, other, lineage, runtime)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="an exported policy folder")
    parser.add_argument("target", type=Path, help="the copy (must not exist)")
    parser.add_argument("steps", type=int, help="steps of each chunk executed")
    args = parser.parse_args()
    if args.target.exists():
        parser.error(f"{args.target} exists: name a new folder")
    print(executing(args.source, args.target, args.steps))


if __name__ == "__main__":
    main()
