"""The demonstrator taking over from states its plans never visit (`motion.plan_takeover`): the label
a correction recording gives. It must start exactly where the policy left the gripper and finish the
task in the simulator, with the block on the table or in the fingers."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from policypipe.synthetic.motion import GripperAndBlock, MotionPlan, plan_motion, plan_takeover
from policypipe.synthetic.simulator import NS, Simulator, start_state

PERIOD = NS // 30


def drive(sim: Simulator, plan: MotionPlan, start_ns: int, stop_ns: int) -> None:
    """The plan's targets at 30 Hz, as a runner's executed steps, until the block is released."""
    for t in range(start_ns, stop_ns, PERIOD):
        position, quaternion = plan.pose_at(np.array([t]))
        sim.step(t, position[0], quaternion[0], float(plan.width_at(np.array([t]))[0]))
        if sim.done():
            return


def strayed_state(seed: int) -> tuple[MotionPlan, Simulator]:
    """A scene's demonstration driven part of the way, then (block not held) pushed off its path as
    a policy strays: up to 6 cm aside, up to 5 cm up, the fingers wide, half open or closed on nothing."""
    rng = np.random.default_rng([11, seed])
    plan = plan_motion(np.random.default_rng([12, seed]), 1_700_000_000 * NS)
    t0 = plan.start_ns
    position, quaternion = plan.pose_at(np.array([t0]))
    sim = Simulator(
        plan.scene,
        start_state(plan.scene, t0, position[0], quaternion[0], float(plan.width_at(np.array([t0]))[0])),
    )
    drive(sim, plan, t0 + PERIOD, t0 + int(rng.uniform(0.5, plan.duration_s - 1.5) * NS))
    s = sim.state
    if not s.held:
        aside = np.array([*rng.normal(0.0, 0.03, 2), rng.uniform(0.0, 0.05)])
        turn = Rotation.from_euler("z", rng.normal(0.0, 0.3)) * Rotation.from_quat(s.quaternion)
        sim.step(s.t_ns + PERIOD, s.position + aside, turn.as_quat(), float(rng.choice([0.08, 0.05, 0.01])))
    return plan, sim


def first_strayed_state(
    wanted: Callable[[GripperAndBlock], bool], what: str
) -> tuple[MotionPlan, Simulator, int]:
    """The first of the 24 strayed states (`strayed_state`) whose simulator state is `wanted`, with
    its seed."""
    for seed in range(24):
        plan, sim = strayed_state(seed)
        if wanted(sim.state):
            return plan, sim, seed
    pytest.fail(f"no strayed state {what}")


def take_over(plan: MotionPlan, sim: Simulator, seed: int) -> MotionPlan:
    return plan_takeover(np.random.default_rng(seed), sim.state.t_ns + PERIOD, plan.scene, sim.state)


@pytest.mark.parametrize("seeds", [range(0, 12), range(12, 24)])
def test_the_demonstrator_takes_over_where_the_gripper_is_and_finishes_the_task(seeds) -> None:
    held = 0
    for seed in seeds:
        plan, sim = strayed_state(seed)
        state = copy.deepcopy(sim.state)
        takeover = take_over(plan, sim, seed)
        position, quaternion = takeover.pose_at(np.array([takeover.start_ns]))
        assert np.linalg.norm(position[0] - state.position) < 1e-6
        assert (
            Rotation.from_quat(quaternion[0]).inv() * Rotation.from_quat(state.quaternion)
        ).magnitude() < 1e-6
        assert takeover.width_at(np.array([takeover.start_ns]))[0] == pytest.approx(state.width, abs=1e-6)
        drive(sim, takeover, takeover.start_ns + PERIOD, takeover.end_ns + PERIOD)
        assert sim.outcome() == "success", (seed, state.held, sim.outcome(), sim.missed_closes)
        held += state.held
    assert 0 < held < len(seeds)  # both kinds of takeover were tried


def test_the_held_blocks_drawing_follows_the_simulators_block() -> None:
    """The frames of a takeover with the block in the fingers draw it where the simulator holds it
    (the grip's offset from the TCP), not at the TCP as a plain plan draws it."""
    plan, sim, seed = first_strayed_state(lambda s: s.held, "held the block")
    takeover = take_over(plan, sim, seed)
    assert takeover.attach_s == 0.0
    worst = 0.0
    for t in range(takeover.start_ns + PERIOD, takeover.start_ns + int(takeover.release_s * NS), PERIOD):
        position, quaternion = takeover.pose_at(np.array([t]))
        sim.step(t, position[0], quaternion[0], float(takeover.width_at(np.array([t]))[0]))
        centre, yaw = takeover.target_at(np.array([t]))
        worst = max(worst, float(np.linalg.norm(centre[0] - sim.state.block_centre)))
        assert sim.state.held
    assert worst < 5e-4
