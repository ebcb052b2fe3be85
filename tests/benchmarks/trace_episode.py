"""One exported policy's episode traced step by step (docs/rollout.md, "The control with more scenes,
and a grip held at every step"): at each executed step, the time from the episode's start, the TCP's
height, the opening sent and the fingers' reading after it, whether the block is held, and the block's
distance from the mark and from where it lay.

    python -m tests.benchmarks.trace_episode POLICY --scene 1010 [--no-hold-grip]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from policypipe.rollout.episode import episode_noise_seed, run_episode
from policypipe.rollout.report import RolloutStageConfig
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.simulator import Simulator


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", type=Path)
    parser.add_argument("--scene", type=int, required=True)
    parser.add_argument("--hold-grip", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = PolicyRunner.load(args.policy)
    stage = RolloutStageConfig(episodes=1, first_seed=args.scene, videos=0, hold_grip=args.hold_grip)
    config = stage.episode_config(runner.spec.frequency_hz, runner.spec.open_deadband_m)
    rows = []
    step = Simulator.step

    def traced(sim: Simulator, t_ns, position, quaternion, width):
        state = step(sim, t_ns, position, quaternion, width)
        lay = np.linalg.norm(state.block_centre[:2] - sim.scene.target_xy)
        rows.append(
            (state.t_ns, state.position[2], width, state.width, state.held, sim.distance_to_mark(), lay)
        )
        return state

    Simulator.step = traced
    try:
        runner.generator.manual_seed(episode_noise_seed(stage.seed, args.scene))  # as the rollout stage
        result = run_episode(runner, args.scene, config)
    finally:
        Simulator.step = step
    print(f"scene {args.scene}: {result.outcome}")
    print("   t s   z mm  sent mm  reading mm  held  from mark mm  from where it lay mm")
    for t, z, sent, reading, held, mark, lay in rows:
        print(
            f"{(t - rows[0][0]) / 1e9:6.2f} {z * 1e3:6.1f} {sent * 1e3:8.1f} {reading * 1e3:11.1f}"
            f" {int(held):5d} {mark * 1e3:13.1f} {lay * 1e3:20.1f}"
        )


if __name__ == "__main__":
    main()
