"""A copy of an exported policy that executes another number of each chunk's steps, or holds the
grip with another deadband, to measure in closed loop how much of a chunk to execute before the next
request, or how wide a deadband keeps a held block, without training again (docs/rollout.md, "How
much of each chunk to execute" and "The runner at 10 Hz: how much of each chunk, and the deadband"):

    python -m tests.benchmarks.execute_steps runs/near/seed0/policy runs/act12/seed0/policy 12
    python -m tests.benchmarks.execute_steps runs/near/seed0/policy runs/db20/seed0/policy 8 \
        --open-deadband-mm 20
    python -m tests.benchmarks.bench_rollout_success --config act12 runs/act12/seed*/policy

The same weights and runtime spec, with `n_action_steps` (1 to the horizon) in both the config and
runtime.json, and the trained value in the copy's lineage (`n_action_steps_trained`); with
`--open-deadband-mm`, runtime.json's `open_deadband_m` too, the trained one in the lineage
(`open_deadband_m_trained`). The monitor's calibration is left out: its thresholds hold for chunks
at the trained schedule.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy, save_policy


def executing(source: Path, target: Path, steps: int, open_deadband_mm: float | None = None) -> Path:
    """`source`'s policy executing `steps` steps of each chunk (and holding a grip against openings
    under `open_deadband_mm`, if given), saved as `target`."""
    if open_deadband_mm is not None and not open_deadband_mm >= 0:
        raise ValueError(f"open_deadband_mm must be >= 0, got {open_deadband_mm}")
    policy = load_policy(source)
    other = DiffusionPolicy(replace(policy.config, n_action_steps=steps))  # checks 1 <= steps <= horizon
    other.load_state_dict(policy.state_dict())
    trained = json.loads((source / "runtime.json").read_text())
    runtime = trained | {"n_action_steps": steps}
    lineage = json.loads((source / "manifest.json").read_text()).get("lineage", {})
    lineage = lineage | {"n_action_steps_trained": policy.config.n_action_steps, "copied_from": str(source)}
    if open_deadband_mm is not None:
        runtime["open_deadband_m"] = open_deadband_mm / 1000.0
        lineage["open_deadband_m_trained"] = trained.get("open_deadband_m", 0.0)
    return save_policy(target, other, lineage, runtime)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="an exported policy folder")
    parser.add_argument("target", type=Path, help="the copy (must not exist)")
    parser.add_argument("steps", type=int, help="steps of each chunk executed")
    parser.add_argument(
        "--open-deadband-mm", type=float, help="the runner's deadband (mm; default: the trained one)"
    )
    args = parser.parse_args()
    if args.target.exists():
        parser.error(f"{args.target} exists: name a new folder")
    print(executing(args.source, args.target, args.steps, args.open_deadband_mm))


if __name__ == "__main__":
    main()
