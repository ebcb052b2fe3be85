"""Whether lifting the block higher, or a wider wrist camera, would bring the mark into view: over a
range of rollout scenes, how often the mark's centre is in the image on the scene's demonstration at
its start, grasp and lift top, and at the lift's top raised to other heights (docs/rollout.md, "Two
levers for the blind carries"); with `--fields-of-view`, the same for cameras of those horizontal
fields of view ("Setting the block down, and a wider wrist camera"). No policy: the demonstration's
poses and the simulator's camera alone.

    python -m tests.benchmarks.screen_mark_view --first-seed 1000 --scenes 100 --heights 0.16 0.2 0.24 0.28
    python -m tests.benchmarks.screen_mark_view --first-seed 1000 --scenes 50 --fields-of-view 96 110 120
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

from policypipe.rollout.episode import RolloutConfig
from policypipe.synthetic import render
from tests.benchmarks.screen_closed_loop_sight import mark_in_view


def focal_per_width(field_of_view_deg: float) -> float:
    """The pinhole's focal length over the image's width for a horizontal field of view."""
    return 0.5 / math.tan(math.radians(field_of_view_deg) / 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-seed", type=int, required=True)
    parser.add_argument("--scenes", type=int, required=True)
    parser.add_argument("--heights", type=float, nargs="*", default=[], help="lift tops to try, metres")
    parser.add_argument(
        "--fields-of-view",
        type=float,
        nargs="*",
        default=[],
        help="horizontal fields of view to try, degrees",
    )
    args = parser.parse_args()
    width, height = camera_size = RolloutConfig().camera_size  # the rollout's wrist camera
    sample_fov = math.degrees(2.0 * math.atan(0.5 / render.FOCAL_PER_WIDTH))
    last = args.first_seed + args.scenes - 1
    for fov in [None, *args.fields_of_view]:
        # camera_matrix reads the module's focal length at each call: the same camera, wider.
        render.FOCAL_PER_WIDTH = focal_per_width(fov if fov is not None else sample_fov)
        seen: Counter[str] = Counter()
        for seed in range(args.first_seed, args.first_seed + args.scenes):
            seen.update(
                name
                for name, in_view in mark_in_view(seed, camera_size, tuple(args.heights)).items()
                if in_view
            )
        which = "the sample's" if fov is None else "a"
        print(
            f"the mark in {which} {fov or sample_fov:.0f}-degree wrist camera's {width}x{height} image, "
            f"scenes {args.first_seed}-{last}:"
        )
        for name in ["start", "grasp", "lifted", *(f"lifted to {1000 * z:.0f} mm" for z in args.heights)]:
            print(f"  {name}: {seen[name]} of {args.scenes}")


if __name__ == "__main__":
    main()
