"""The person's hand of `policypipe sample --hand` measured from the generator (docs/sample-data.md,
"A person's hand"): over N plans of rollout-like scenes with and without it, how the hand arrives
above the block, where it grasps, how square the fingers close, where the block is placed, how long a
recording lasts, whether the demonstration replayed through the simulator succeeds, and how high
above the table it lets the block go.

    python -m tests.benchmarks.measure_persons_hand --plans 3000
"""

from __future__ import annotations

import argparse
import collections
import json
import math

import numpy as np

from policypipe.synthetic.motion import MotionPlan, PersonsHand, plan_motion
from policypipe.synthetic.simulator import NS, Simulator, _off_square, start_state

START_NS = 1_700_000_000 * NS
CAMERA_HZ = 30.0


def replay(plan: MotionPlan) -> Simulator:
    """The plan's motion sent to the simulator as timed targets at the camera's rate."""
    t = np.arange(plan.start_ns, plan.end_ns, int(NS / CAMERA_HZ), dtype=np.int64)
    position, quaternion = plan.pose_at(t)
    width = plan.width_at(t)
    sim = Simulator(plan.scene, start_state(plan.scene, t[0], position[0], quaternion[0], width[0]))
    for i in range(1, len(t)):
        sim.step(t[i], position[i], quaternion[i], width[i])
    return sim


def percentiles(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {
        k: round(float(np.percentile(v, q)), 2)
        for k, q in (("min", 0), ("median", 50), ("p99", 99), ("max", 100))
    }


def measure(plans: int, persons: bool) -> dict:
    outcomes: collections.Counter[str] = collections.Counter()
    place_mm, released_mm, square_deg, along_mm, duration_s, turn_deg, off_mm = [], [], [], [], [], [], []
    for seed in range(plans):
        hand_rng = np.random.default_rng([11, seed]) if persons else None
        plan = plan_motion(np.random.default_rng([7, seed]), START_NS, hand_rng=hand_rng)
        sim = replay(plan)
        outcomes[sim.outcome()] += 1
        place_mm.append(sim.distance_to_mark() * 1000)
        released_mm.append(sim.released_at["height_m"] * 1000)
        duration_s.append(plan.duration_s)
        grasp_s = plan._seconds(np.array([plan.events_ns["grasp"]]))
        square_deg.append(abs(math.degrees(_off_square(plan.scene.target_yaw - plan._heading(grasp_s)[0]))))
        if persons:
            hand = PersonsHand.draw(np.random.default_rng([11, seed]))
            along_mm.append(abs(float(plan.grip_offset_tool[0])) * 1000)
            if hand.arrives_astray:
                turn_deg.append(abs(math.degrees(hand.arrival_turn_rad)))
                off_mm.append(float(np.linalg.norm(hand.arrival_off_m)) * 1000)
    result = {
        "plans": plans,
        "outcomes": dict(outcomes),
        "placed_from_mark_mm": percentiles(place_mm),
        # The block's bottom over the table as the fingers let it go, in the simulator (which holds it
        # where the fingers met it and lets a held block pass into the table; released, it rests on it).
        "released_at_height_mm": percentiles(released_mm),
        "off_square_at_close_deg": percentiles(square_deg),
        "duration_s": percentiles(duration_s),
    }
    if persons:
        result["held_off_centre_mm"] = percentiles(along_mm)
        result["arrive_astray"] = len(turn_deg)
        result["arrive_turned"] = sum(t > 0 for t in turn_deg)
        result["arrive_off"] = sum(o > 0 for o in off_mm)
        result["arrival_turn_deg"] = percentiles([t for t in turn_deg if t > 0])
        result["arrival_off_mm"] = percentiles([o for o in off_mm if o > 0])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plans", type=int, default=3000)
    args = parser.parse_args()
    print(
        json.dumps({"plain": measure(args.plans, False), "persons_hand": measure(args.plans, True)}, indent=2)
    )


if __name__ == "__main__":
    main()
