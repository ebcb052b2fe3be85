"""Whether lifting the block higher would bring the mark into the wrist camera's view: over a range
of rollout scenes, how often the mark's centre is in the image on the scene's demonstration at its
start, grasp and lift top, and at the lift's top raised to other heights (docs/rollout.md, "Two levers
for the blind carries"). No policy: the demonstration's poses
and the simulator's camera alone.

    python -m tests.benchmarks.screen_mark_view --first-seed 1000 --scenes 100 --heights 0.16 0.2 0.24 0.28
"""

from __future__ import annotations

import argparse
from collections import Counter

from policypipe.rollout.episode import RolloutConfig
from tests.benchmarks.screen_closed_loop_sight import mark_in_view


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-seed", type=int, required=True)
    parser.add_argument("--scenes", type=int, required=True)
    parser.add_argument("--heights", type=float, nargs="*", default=[], help="lift tops to try, metres")
    args = parser.parse_args()
    width, height = camera_size = RolloutConfig().camera_size  # the rollout's wrist camera
    seen: Counter[str] = Counter()
    for seed in range(args.first_seed, args.first_seed + args.scenes):
        seen.update(
            name for name, in_view in mark_in_view(seed, camera_size, tuple(args.heights)).items() if in_view
        )
    last = args.first_seed + args.scenes - 1
    print(f"the mark in the wrist camera's {width}x{height} image, scenes {args.first_seed}-{last}:")
    for name in ["start", "grasp", "lifted", *(f"lifted to {1000 * z:.0f} mm" for z in args.heights)]:
        print(f"  {name}: {seen[name]} of {args.scenes}")


if __name__ == "__main__":
    main()
