"""How often the runner's deadband held back an opening, per episode outcome: one exported policy
with `open_deadband_m`, its rollout scenes in one process, each seeded as the rollout stage seeds
it (the outcomes are `bench_rollout_success`'s). Counts the executed steps that asked the fingers
to open by less than the deadband while the gripper did not report holding nothing, in all and in
each episode's last 3 seconds (docs/runtime.md, "The gripper's deadband").

    python -m tests.benchmarks.measure_deadband_holds POLICY --first-seed 0 --episodes 50 --out F.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from policypipe.rollout.episode import LEAD_IN_NS, episode_noise_seed, run_episode
from policypipe.rollout.report import RolloutStageConfig
from policypipe.runtime.chunk import held_by_deadband
from policypipe.runtime.runner import PolicyRunner

LAST_S = 3.0


class HeldBackOpenings:
    """The runner, noting the time (s from the first frame) of each executed step the deadband held."""

    def __init__(self, runner: PolicyRunner) -> None:
        self.runner = runner
        self.times_s: list[float] = []

    def act(self, observation, now_ns=None, episode_start_ns=None):
        chunk = self.runner.act(observation, now_ns=now_ns, episode_start_ns=episode_start_ns)
        t = int(observation.frame_ns[-1])
        holding = observation.grippers[0].holding_at(t)
        held = chunk.execute & held_by_deadband(
            chunk.relative[:, 9], self.runner.spec.open_deadband_m, holding
        )
        self.times_s += [(t - episode_start_ns) / 1e9] * int(held.sum())
        return chunk


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", type=Path)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = PolicyRunner.load(args.policy)
    stage = RolloutStageConfig(episodes=args.episodes, first_seed=args.first_seed, videos=0)
    config = stage.episode_config(runner.spec.frequency_hz, runner.spec.open_deadband_m)
    episodes = defaultdict(list)
    for seed in range(args.first_seed, args.first_seed + args.episodes):
        runner.generator.manual_seed(episode_noise_seed(stage.seed, seed))  # as the rollout stage
        traced = HeldBackOpenings(runner)
        result = run_episode(traced, seed, config)
        end_s = result.duration_s + LEAD_IN_NS / 1e9  # from the first frame, as the steps' times
        late = sum(t > end_s - LAST_S for t in traced.times_s)
        episodes[result.outcome].append(
            {"seed": seed, "held_back_steps": len(traced.times_s), "in_its_last_3_s": late}
        )
        print(seed, result.outcome, len(traced.times_s), late, flush=True)
    summary = {
        outcome: {
            "episodes": len(rows),
            "with_a_held_back_opening": sum(r["held_back_steps"] > 0 for r in rows),
            "median_held_back_steps": float(np.median([r["held_back_steps"] for r in rows])),
            "median_in_its_last_3_s": float(np.median([r["in_its_last_3_s"] for r in rows])),
        }
        for outcome, rows in episodes.items()
    }
    print(json.dumps(summary, indent=1))
    scenes = [args.first_seed, args.first_seed + args.episodes - 1]
    out = {"policy": str(args.policy), "scenes": scenes, "summary": summary, "episodes": episodes}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
