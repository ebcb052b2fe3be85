"""The turn-response check: does the policy follow the block's turn in frames where only the block turns?"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import rot6d
from policypipe.rollout import turn_response as tr
from policypipe.rollout.episode import rollout_scene


def test_the_slope_pools_each_scenes_response_against_its_own_to_the_unturned_block() -> None:
    turns = tr.TURNS_DEG
    # Two scenes with different offsets, one near the wrap at 180 degrees, both following at -0.5.
    responses = [
        [-0.5 * t + 20.0 for t in turns],
        [math.degrees(math.remainder(math.radians(-0.5 * t + 175.0), 2 * math.pi)) for t in turns],
    ]
    assert tr.slope(turns, responses) == pytest.approx(-0.5)
    assert tr.slope(turns, [[3.0] * len(turns)]) == 0.0


def test_the_demonstrator_turns_towards_the_turned_block_and_not_without_it() -> None:
    plan = rollout_scene(1000)
    t0 = plan.start_ns + int((plan.knot_s[1] + tr.INTO_APPROACH_S) * 1e9)
    ahead = int(16 / 30 * 1e9)
    unturned = tr.demonstrator_turn(plan, 0.0, t0, ahead)
    _, quat = plan.pose_at(np.array([t0, t0 + ahead]))
    r0, r1 = Rotation.from_quat(quat).as_matrix()
    assert unturned == pytest.approx(tr.turn_about_approach(r0.T @ r1), abs=1e-9)  # the plan itself
    # A block turned by 10 degrees: the hand turns part of the way by then (a minimum-jerk approach),
    # the other way round about its downward axis.
    follows = (tr.demonstrator_turn(plan, math.radians(10), t0, ahead) - unturned) / math.radians(10)
    assert -1.0 < follows < -0.2


class StillRunner:
    """A runner that never turns, whatever it sees: a policy blind to the block."""

    spec = SimpleNamespace(n_obs_steps=1)
    action_offsets_ns = np.round(np.arange(1, 17) / 30 * 1e9).astype(np.int64)

    def __init__(self) -> None:
        self.episodes = 0

    def start_episode(self) -> None:
        self.episodes += 1

    def act(self, observation, seed=None, episode_start_ns=None):
        assert observation.cameras[0].frames.shape == (2, 240, 320, 3)
        relative = np.zeros((16, 10))
        relative[:, 3:9] = rot6d(np.eye(3))
        return SimpleNamespace(relative=relative)


def test_a_policy_blind_to_the_block_has_slope_zero_beside_the_demonstrators() -> None:
    runner = StillRunner()
    result = tr.turn_response(runner, range(1000, 1003))
    assert result["policy_slope"] == 0.0 and result["seen_fraction"] == 0.0
    # Each turned frame is an episode of its own (a policy that remembers its start sees it first).
    assert runner.episodes == 3 * len(tr.TURNS_DEG)
    assert -1.0 < result["demonstrator_slope"] < -0.2
    assert result["scenes"] == [1000, 1002]


def test_a_turn_that_flips_the_demonstrators_way_of_lining_up_is_left_out_for_both() -> None:
    # Scene 4 asks for a turn of -60 degrees: turned by -45 more, the block is lined up the other way
    # round (+75), and the demonstrator's turn jumps; every other turn keeps its way.
    plan = rollout_scene(4)
    kept = [tr.same_way(plan, math.radians(t)) for t in tr.TURNS_DEG]
    assert kept == [False, True, True, True, True, True, True]
    responses = [[100.0, 10.0, 5.0, 0.0, -5.0, -10.0, -15.0]]  # a jump where it flips, -1/3 elsewhere
    assert tr.slope(tr.TURNS_DEG, responses, [kept]) == pytest.approx(-1 / 3)
