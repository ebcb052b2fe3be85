from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import EpisodeStreams, WindowConfig, rot6d
from policypipe.evaluation.errors import (
    bootstrap_mean_ci,
    chunk_errors,
    hold_still,
    mean_pairwise_distance_mm,
    summarize,
)

WINDOW = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)


def straight_line(n=60, speed=0.2, dt=1 / 30):
    """The gripper moves along world x at constant speed, turned 30 degrees about z."""
    t = np.arange(n) * dt
    pos = np.stack([speed * t, np.zeros(n), np.full(n, 0.2)], axis=1)
    rotvec = np.tile(Rotation.from_euler("z", 30, degrees=True).as_rotvec(), (n, 1))
    width = np.full(n, 0.05)
    return pos, rotvec, width


def recorded_actions(pos, rotvec, width, anchors, dt=1 / 30) -> np.ndarray:
    """(N, H, 10) recorded chunks at `anchors` of one episode whose frames and samples are at k * dt."""
    t, ends = np.arange(len(pos)) * dt, np.array([len(pos)])
    return EpisodeStreams(1 / dt, t, ends, t, pos, rotvec, ends, t, width, ends).windows(anchors, WINDOW).action


def test_a_policy_that_predicts_the_recorded_future_has_zero_error() -> None:
    pos, rotvec, width = straight_line()
    anchors = np.arange(0, 40, 5)
    recorded = recorded_actions(pos, rotvec, width, anchors)
    errors = chunk_errors(recorded, recorded)
    for name, e in errors.items():
        assert np.allclose(e, 0, atol=1e-6), name
    summary = summarize(errors["position_mm"], WINDOW.n_action_steps)
    assert summary["executed"]["mean"] == pytest.approx(0, abs=1e-6)


def test_hold_still_error_on_a_straight_line_equals_its_analytic_value() -> None:
    speed, dt = 0.2, 1 / 30
    pos, rotvec, width = straight_line(speed=speed, dt=dt)
    anchors = np.arange(0, 40, 5)  # far from the end: no padding in the window
    recorded = recorded_actions(pos, rotvec, width, anchors, dt)
    errors = chunk_errors(hold_still(width[anchors], WINDOW.horizon), recorded)
    # Step h of the chunk is h + 1 periods ahead: the gripper is (h + 1) * speed * dt away, the same turn, same width.
    analytic = 1000 * speed * dt * (np.arange(WINDOW.horizon) + 1)
    assert np.allclose(errors["position_mm"], analytic[None], atol=1e-9)
    assert np.allclose(errors["rotation_deg"], 0, atol=1e-6) and np.allclose(errors["width_mm"], 0)
    executed = summarize(errors["position_mm"], WINDOW.n_action_steps)["executed"]["mean"]
    assert executed == pytest.approx(1000 * speed * dt * np.mean(np.arange(WINDOW.n_action_steps) + 1))


def test_rotation_error_is_the_geodesic_angle() -> None:
    base = np.zeros((1, 1, 10))
    base[..., 3:9] = rot6d(np.eye(3))
    turned = base.copy()
    turned[..., 3:9] = rot6d(Rotation.from_euler("y", 25, degrees=True).as_matrix())
    assert chunk_errors(turned, base)["rotation_deg"][0, 0] == pytest.approx(25)


def test_spread_and_bootstrap() -> None:
    same = np.zeros((8, 8, 10))
    assert mean_pairwise_distance_mm(same, 4) == 0
    two = np.zeros((2, 8, 10))
    two[1, :, 0] = 0.01
    assert mean_pairwise_distance_mm(two, 4) == pytest.approx(10)
    lo, hi = bootstrap_mean_ci(np.zeros(50), seed=0)
    assert lo == hi == 0
    lo, hi = bootstrap_mean_ci(np.random.default_rng(0).normal(1.0, 0.1, 200), seed=0)
    assert lo < 1.0 < hi and hi - lo < 0.1
