"""Does the policy see how the block is turned? Its answer to the same frame with only the block turned.

An offline check of perception that the sample's renderer makes possible (docs/rollout.md, "Teaching
the encoder what the recordings know"): in each scene, 0.3 s into the demonstrator's approach, the
wrist camera's frames are rendered at the demonstrator's poses with only the block turned by each of
`TURNS_DEG`, and the runner is asked for a chunk, with the same noise for every turn. The turn it
commands by the chunk's last step (about half a second ahead, about the approach axis) is compared
with the turn the demonstrator makes by then towards the turned block (its plan with the grasp yaw
the turned block asks for). The slope of each against the block's turn, pooled over the scenes,
says how much of the turn is seen: the demonstrator's is what following the block gives, a policy
that ignores the block gives 0. The issue's diagnosis measured -0.03 for the demo policy against the
demonstrator's -0.65.

A block looks the same turned by half a turn, so the demonstrator lines its fingers up the nearer of
two ways; a turn that carries the block past the boundary between them flips its choice and its turn
jumps. Only the turns that keep the unturned block's way count (`same_way`), for both.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import rot6d_to_matrix
from policypipe.rollout.episode import observation_of, rollout_scene
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.motion import MotionPlan, _equivalent_yaw
from policypipe.synthetic.render import render_view_bgr, table_texture

TURNS_DEG = (-45.0, -30.0, -15.0, 0.0, 15.0, 30.0, 45.0)
INTO_APPROACH_S = 0.3  # after the first still phase (plan knot 1): the block in view, the turn to come
FRAME_S = 1 / 30.0
CAMERA_SIZE = (320, 240)  # the sample recordings' frames
APPROACH_KNOT = 2  # the plan's knot where the approach ends at the grasp yaw (`plan_motion`)


def turn_about_approach(relative_rotation: np.ndarray) -> float:
    """The angle (rad) of a relative rotation (3, 3), in the gripper's frame, about its approach axis
    (the tool's z, pointing down at the table)."""
    return math.atan2(relative_rotation[1, 0], relative_rotation[0, 0])


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def demonstrator_turn(plan: MotionPlan, turn: float, t0_ns: int, ahead_ns: int) -> float:
    """The demonstrator's turn (rad) about the approach axis from t0 to t0 + ahead, in the scene with
    its block turned by `turn`: every knot from the end of the approach on takes the grasp yaw the
    turned block asks for (the closer of the two that line the fingers up with it, as `plan_motion`
    chooses)."""
    grasp_yaw = plan.knot_yaw[APPROACH_KNOT]
    turned = _equivalent_yaw(float(plan.knot_yaw[0]), plan.scene.target_yaw + turn)
    knot_yaw = plan.knot_yaw.copy()
    knot_yaw[APPROACH_KNOT:] += turned - grasp_yaw
    _, quat = replace(plan, knot_yaw=knot_yaw).pose_at(np.array([t0_ns, t0_ns + ahead_ns]))
    r0, r1 = Rotation.from_quat(quat).as_matrix()
    return turn_about_approach(r0.T @ r1)


def same_way(plan: MotionPlan, turn: float) -> bool:
    """Whether the demonstrator lines its fingers up with the block turned by `turn` the same way as
    with the unturned block (its grasp yaw turns by `turn` too, not by `turn` less half a turn)."""
    start = float(plan.knot_yaw[0])
    moved = _equivalent_yaw(start, plan.scene.target_yaw + turn) - _equivalent_yaw(
        start, plan.scene.target_yaw
    )
    return abs(moved - turn) < 1e-6


def scene_turns(runner: PolicyRunner, seed: int, turns_deg=TURNS_DEG) -> dict[str, list]:
    """Rollout scene `seed`: the policy's and the demonstrator's turns (degrees) for each block turn,
    and whether it keeps the demonstrator's way (`same_way`)."""
    plan = rollout_scene(seed)
    texture = table_texture(plan.scene)
    t0 = plan.start_ns + int(round((plan.knot_s[1] + INTO_APPROACH_S) * 1e9))
    history = runner.spec.n_obs_steps + 1  # the frames the runner picks from, and one before
    times = t0 - np.round(np.arange(history)[::-1] * FRAME_S * 1e9).astype(np.int64)
    position, quat = plan.pose_at(times)
    width = plan.width_at(times)
    centre, yaw = plan.target_at(times)
    ahead_ns = int(runner.action_offsets_ns[-1])
    policy, demonstrator = [], []
    for turn_deg in turns_deg:
        turn = math.radians(turn_deg)
        frames = [
            render_view_bgr(
                plan.scene, texture, position[j], quat[j], centre[j], yaw[j] + turn, width[j], CAMERA_SIZE
            )[..., ::-1]
            for j in range(history)
        ]
        observation = observation_of(
            [(int(times[j]), frames[j], position[j], quat[j], float(width[j])) for j in range(history)]
        )
        runner.start_episode()  # each turn its own episode (a policy that remembers its start)
        chunk = runner.act(observation, seed=seed, episode_start_ns=int(times[0]))
        policy.append(math.degrees(turn_about_approach(rot6d_to_matrix(chunk.relative[-1, 3:9]))))
        demonstrator.append(math.degrees(demonstrator_turn(plan, turn, t0, ahead_ns)))
    kept = [same_way(plan, math.radians(turn_deg)) for turn_deg in turns_deg]
    return {"policy": policy, "demonstrator": demonstrator, "same_way": kept}


def slope(turns_deg, responses: list[list[float]], kept: list[list[bool]] | None = None) -> float:
    """The least-squares slope of each scene's response, less its response to the unturned block,
    against the block's turn, over the scenes' `kept` turns pooled (a line through the origin)."""
    x = np.asarray(turns_deg, dtype=np.float64)
    zero = list(turns_deg).index(0.0)
    y = np.asarray(responses, dtype=np.float64)
    y = np.vectorize(lambda a: math.degrees(_wrap(math.radians(a))))(y - y[:, zero : zero + 1])
    mask = np.ones_like(y, bool) if kept is None else np.asarray(kept, bool)
    xs = np.broadcast_to(x, y.shape)[mask]
    return float((y[mask] * xs).sum() / (xs @ xs))


def turn_response(runner: PolicyRunner, seeds: range, turns_deg=TURNS_DEG) -> dict[str, Any]:
    """The check over rollout scenes `seeds`: each one's turns, and the two slopes."""
    scenes = {seed: scene_turns(runner, seed, turns_deg) for seed in seeds}
    kept = [s["same_way"] for s in scenes.values()]
    policy = slope(turns_deg, [s["policy"] for s in scenes.values()], kept)
    demonstrator = slope(turns_deg, [s["demonstrator"] for s in scenes.values()], kept)
    return {
        "rule": f"frames {INTO_APPROACH_S} s into the approach, only the block turned; the turn by the "
        "chunk's last step about the approach axis; slope over the scenes' turns that keep the "
        "demonstrator's way of lining up",
        "turns_deg": list(turns_deg),
        "scenes": [seeds.start, seeds.stop - 1],
        "turns_kept": int(np.sum(kept)),
        "policy_slope": round(policy, 4),
        "demonstrator_slope": round(demonstrator, 4),
        "seen_fraction": round(policy / demonstrator, 3) if demonstrator else None,
    }
