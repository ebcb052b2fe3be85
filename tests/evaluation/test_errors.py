from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import EpisodeStreams, WindowConfig, rot6d
from policypipe.evaluation.errors import (
    bootstrap_mean_ci,
    chunk_errors,
    ci_scope,
    constant_velocity,
    difference_summary,
    foreign_episode_partners,
    hierarchical_bootstrap,
    hold_still,
    mean_pairwise_distance_mm,
    moving_samples,
    percentile_ci,
    seeds_summary,
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
    return (
        EpisodeStreams(1 / dt, t, ends, t, pos, rotvec, ends, t, width, ends).windows(anchors, WINDOW).action
    )


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
    errors = chunk_errors(hold_still(len(anchors), WINDOW.horizon), recorded)
    # Step h of the chunk is h + 1 periods ahead: the gripper is (h + 1) * speed * dt away, the same turn,
    # same width.
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
    lo, hi = bootstrap_mean_ci(np.zeros(50), np.repeat(np.arange(5), 10), seed=0)
    assert lo == hi == 0
    lo, hi = bootstrap_mean_ci(np.random.default_rng(0).normal(1.0, 0.1, 200), np.arange(200) // 20, seed=0)
    assert lo < 1.0 < hi and hi - lo < 0.1


# --- constant velocity ------------------------------------------------------------------------

FREQUENCY = 30.0


def screw_motion(t: np.ndarray, twist: np.ndarray) -> np.ndarray:
    """(len(t), 4, 4): the pose at time t relative to t = 0 under a constant body-frame twist
    (angular, linear), by the matrix exponential (not by composing steps, as the baseline does)."""
    w, v = twist[:3], twist[3:]
    xi = np.zeros((4, 4))
    xi[:3, :3] = [[0, -w[2], w[1]], [w[2], 0, -w[0]], [-w[1], w[0], 0]]
    xi[:3, 3] = v
    return np.stack([expm(ti * xi) for ti in t])


def as_pose_vectors(poses: np.ndarray) -> np.ndarray:
    return np.concatenate([poses[:, :3, 3], rot6d(poses[:, :3, :3])], axis=-1)


@pytest.mark.parametrize("n_obs", [2, 3])
def test_constant_velocity_continues_a_screw_motion_exactly(n_obs: int) -> None:
    horizon = 6
    twists = [np.array([0.3, -0.2, 1.1, 0.2, 0.05, -0.1]), np.array([0.0, 0.0, 0.0, -0.15, 0.1, 0.02])]
    obs_t = -(n_obs - 1 - np.arange(n_obs)) / FREQUENCY  # the last observation is the anchor
    act_t = np.arange(1, horizon + 1) / FREQUENCY  # action step k is k + 1 intervals ahead
    obs_pose = np.stack([as_pose_vectors(screw_motion(obs_t, tw)) for tw in twists])
    truth = np.stack([as_pose_vectors(screw_motion(act_t, tw)) for tw in twists])
    # The width opens at 0.1 m/s from 0.04 m.
    obs_width = (0.04 + 0.1 * obs_t)[None, :, None].repeat(2, axis=0)
    truth_width = 0.1 * act_t  # actions hold the change from the current width, 0.04 m

    chunk = constant_velocity(obs_pose, obs_width, horizon)

    assert chunk.shape == (2, horizon, 10)
    assert np.allclose(chunk[..., :9], truth, atol=1e-12)
    assert np.allclose(chunk[..., 9], truth_width[None], atol=1e-12)
    recorded = np.concatenate([truth, truth_width[None, :, None].repeat(2, axis=0)], axis=-1)
    for name, e in chunk_errors(chunk, recorded).items():
        assert np.allclose(e, 0, atol=1e-4), name


def test_constant_velocity_clips_the_width_to_the_training_range() -> None:
    obs_pose = np.zeros((1, 2, 9))
    obs_pose[..., 3] = obs_pose[..., 7] = 1.0  # identity rotations: standing still
    obs_width = np.array([[[0.05], [0.07]]])  # opening 2 cm a step
    chunk = constant_velocity(obs_pose, obs_width, 4, width_range=(0.0, 0.1))
    # Changes from the current 0.07 m: 0.09 m, then clipped at 0.1 m.
    assert np.allclose(chunk[0, :, 9], [0.02, 0.03, 0.03, 0.03])
    assert np.allclose(constant_velocity(obs_pose, obs_width, 4)[0, :, 9], [0.02, 0.04, 0.06, 0.08])
    assert np.allclose(chunk[0, :, :3], 0) and np.allclose(chunk[0, :, 3:9], obs_pose[0, -1, 3:9])


def test_constant_velocity_needs_two_observations() -> None:
    with pytest.raises(ValueError, match="at least 2 observation steps"):
        constant_velocity(np.zeros((3, 1, 9)), np.zeros((3, 1, 1)), 4)


# --- samples of another episode -----------------------------------------------------------------


@pytest.mark.parametrize("episodes", [[0] * 5 + [1] * 4 + [2] * 7 + [3] * 3, [4, 4, 9, 9], list(range(6))])
def test_partners_are_a_seeded_shuffle_that_never_keeps_the_episode(episodes) -> None:
    episodes = np.asarray(episodes)
    partners = foreign_episode_partners(episodes, seed=3)
    assert np.all(episodes[partners] != episodes)
    assert sorted(partners.tolist()) == list(
        range(len(episodes))
    )  # a permutation: each sample's frames used once
    assert np.array_equal(partners, foreign_episode_partners(episodes, seed=3))


def test_partners_differ_between_seeds() -> None:
    episodes = np.repeat(np.arange(6), 10)
    assert not np.array_equal(foreign_episode_partners(episodes, 0), foreign_episode_partners(episodes, 1))


def test_partners_when_one_episode_holds_most_samples() -> None:
    episodes = np.array([0] * 9 + [1, 2])  # no permutation can move all nine out of episode 0
    partners = foreign_episode_partners(episodes, seed=0)
    assert np.all(episodes[partners] != episodes)
    with pytest.raises(ValueError, match="at least 2 episodes"):
        foreign_episode_partners(np.zeros(5, dtype=int), seed=0)


# --- bootstrap over seeds and samples -----------------------------------------------------------


def test_a_large_spread_between_seeds_widens_the_ci() -> None:
    rng = np.random.default_rng(0)
    offsets = np.array([-3.0, -1.5, 0.0, 1.5, 3.0])[:, None]
    errors = 10 + offsets + rng.normal(0, 1, (5, 300))  # 5 seeds, 300 samples
    episodes = np.arange(300) // 30  # 10 episodes with no episode effect
    seeds_and_samples = percentile_ci(
        hierarchical_bootstrap({"A": {"x": errors}}, episodes, seed=0)["A"]["x"]
    )
    samples_only = percentile_ci(
        hierarchical_bootstrap({"A": {"x": errors.mean(axis=0, keepdims=True)}}, episodes, seed=0)["A"]["x"]
    )
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(seeds_and_samples) > 10 * width(samples_only)
    # Five seeds spread like this: the mean is uncertain by about 2.0 / sqrt(5) ~ 0.9 either way.
    assert 2.0 < width(seeds_and_samples) < 5.0
    assert seeds_and_samples[0] < errors.mean() < seeds_and_samples[1]


def test_one_seed_and_one_episode_give_the_samples_ci_of_the_mean() -> None:
    values = np.random.default_rng(1).normal(2.0, 1.0, (1, 400))
    one_episode = np.zeros(400, dtype=int)
    lo, hi = percentile_ci(
        hierarchical_bootstrap({"A": {"x": values}}, one_episode, seed=0, resamples=4000)["A"]["x"]
    )
    assert lo < values.mean() < hi
    assert hi - lo == pytest.approx(2 * 1.96 * values.std() / np.sqrt(400), rel=0.1)


def test_a_difference_of_exactly_zero_has_a_ci_containing_zero() -> None:
    rng = np.random.default_rng(2)
    one_seed = rng.normal(5, 2, (1, 100))
    episodes = np.arange(100) // 10
    same = difference_summary({"position_mm": one_seed}, {"position_mm": one_seed.copy()}, episodes, seed=0)[
        "position_mm"
    ]
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]
    seeds = 5 + rng.normal(0, 1, (3, 1)) + rng.normal(0, 2, (3, 100))
    same = difference_summary({"position_mm": seeds}, {"position_mm": seeds.copy()}, episodes, seed=0)[
        "position_mm"
    ]
    assert same["mean"] == 0 and same["ci95"][0] < 0 < same["ci95"][1]


def test_shared_samples_keep_a_paired_difference_exact() -> None:
    rng = np.random.default_rng(3)
    episodes = np.arange(200) // 25
    a = rng.normal(10, 5, (1, 200)) + rng.normal(0, 5, 8)[episodes]  # samples and episodes differ a lot ...
    diff = difference_summary({"width_mm": a}, {"width_mm": a + 1.0}, episodes, seed=0)["width_mm"]
    assert diff["mean"] == pytest.approx(1.0) and diff["ci95"] == pytest.approx(
        [1.0, 1.0]
    )  # ... B is 1 worse on each


def test_bootstrap_needs_the_same_samples_everywhere() -> None:
    with pytest.raises(ValueError, match="same samples"):
        hierarchical_bootstrap(
            {"A": {"x": np.zeros((1, 5))}, "B": {"x": np.zeros((1, 6))}}, np.zeros(5), seed=0
        )
    with pytest.raises(ValueError, match="4 episode labels for 5 samples"):
        hierarchical_bootstrap({"A": {"x": np.zeros((1, 5))}}, np.zeros(4), seed=0)


def test_seeds_summary_names_the_best_baseline_per_component() -> None:
    rng = np.random.default_rng(4)
    n = 200
    policy = {"position_mm": rng.normal(5, 1, (3, n)), "width_mm": rng.normal(2, 0.5, (3, n))}
    ablation = {c: x + 3.0 for c, x in policy.items()}  # without its own frames, 3 worse on every sample
    baselines = {
        "hold_still": {"position_mm": rng.normal(12, 1, n), "width_mm": rng.normal(1.5, 0.2, n)},
        "constant_velocity": {"position_mm": rng.normal(4, 1, n), "width_mm": rng.normal(3, 0.2, n)},
    }
    summary = seeds_summary(policy, ablation, baselines, np.arange(n) // 20, seed=0)
    assert summary["position_mm"]["best_baseline"] == "constant_velocity"
    assert summary["width_mm"]["best_baseline"] == "hold_still"
    for c, best in (("position_mm", "constant_velocity"), ("width_mm", "hold_still")):
        ratio = summary[c]["ratio_to_best_baseline"]
        assert ratio["mean"] == pytest.approx(policy[c].mean() / baselines[best][c].mean())
        assert ratio["ci95"][0] < ratio["mean"] < ratio["ci95"][1]
        assert summary[c]["camera_ablation_gap"]["mean"] == pytest.approx(3.0)
        assert summary[c]["camera_ablation_gap"]["ci95"] == pytest.approx([3.0, 3.0])
        assert set(summary[c]["baselines"]) == set(baselines)
    assert summary["position_mm"]["ratio_to_best_baseline"]["mean"] > 1  # worse than constant velocity


def test_ci_scope_names_the_levels_it_covers() -> None:
    assert ci_scope({"A": 1}, 7) == "episodes, then samples within them (one seed; 7 episodes)"
    assert (
        ci_scope({"A": 1, "B": 1}, 7) == "episodes, then samples within them (one seed per side; 7 episodes)"
    )
    assert (
        ci_scope({"A": 3, "B": 1}, 7)
        == "seeds, episodes, then samples within them (A: 3 seeds, B: 1 seed; 7 episodes)"
    )
    assert ci_scope({"A": 1}, 1) == "samples of the one episode only (one seed; 1 episode)"


# --- episodes as the unit of the bootstrap -------------------------------------------------------


def episodes_with_an_effect(rng, episodes=20, per_episode=30, between=1.0, within=1.0):
    """(N,) values: an episode effect of standard deviation `between` plus sample noise `within`,
    and (N,) each sample's episode."""
    labels = np.repeat(np.arange(episodes), per_episode)
    return rng.normal(0, between, episodes)[labels] + rng.normal(0, within, len(labels)), labels


def ci_width(values, episodes, seed=0) -> float:
    reps = hierarchical_bootstrap({"A": {"x": values[None]}}, episodes, seed, resamples=4000)["A"]["x"]
    lo, hi = percentile_ci(reps)
    return hi - lo


def test_the_ci_over_episodes_matches_the_analytic_error_of_the_grand_mean() -> None:
    # 20 episodes of 30 samples, between- and within-episode standard deviation 1: the grand mean
    # varies by sqrt(1/20 + 1/600) = 0.227; samples taken as independent would claim sqrt(2/600) = 0.058.
    analytic = 2 * 1.96 * np.sqrt(1 / 20 + 1 / 600)
    episode_level, sample_level = [], []
    for seed in range(5):
        values, episodes = episodes_with_an_effect(np.random.default_rng(seed))
        episode_level.append(ci_width(values, episodes))
        sample_level.append(ci_width(values, np.arange(len(values))))  # every sample its own episode
    assert np.mean(episode_level) == pytest.approx(analytic, rel=0.2)
    assert np.mean(sample_level) < 0.4 * analytic


def test_camera_gaps_resample_episodes_too() -> None:
    values, episodes = episodes_with_an_effect(np.random.default_rng(7))
    lo, hi = bootstrap_mean_ci(values, episodes, seed=0, resamples=4000)
    lo_s, hi_s = bootstrap_mean_ci(values, np.arange(len(values)), seed=0, resamples=4000)
    assert lo < values.mean() < hi and hi - lo > 2.5 * (hi_s - lo_s)


def test_a_comparison_over_episodes_stays_paired() -> None:
    rng = np.random.default_rng(8)
    a, episodes = episodes_with_an_effect(rng, between=5.0)  # episodes differ a lot ...
    shift = rng.normal(1.0, 0.1, 20)[episodes]  # ... B is about 1 worse in each
    diff = difference_summary({"position_mm": a[None]}, {"position_mm": (a + shift)[None]}, episodes, seed=0)
    lo, hi = diff["position_mm"]["ci95"]
    # Paired, only the shift's spread between episodes counts: 2 * 1.96 * 0.1 / sqrt(20) = 0.088.
    assert lo < 1.0 < hi and hi - lo == pytest.approx(2 * 1.96 * 0.1 / np.sqrt(20), rel=0.3)


def test_a_replicate_is_the_mean_of_the_samples_of_its_drawn_episodes() -> None:
    # One episode of 1 sample at 0, one of 99 at 1. Drawn twice, either episode gives its own value;
    # both drawn give 99 ones and a zero.
    values = np.concatenate([[0.0], np.ones(99)])
    reps = hierarchical_bootstrap({"A": {"x": values[None]}}, np.array([0] + [1] * 99), seed=0)["A"]["x"]
    assert set(np.round(reps, 12).tolist()) == {0.0, 0.99, 1.0}


# --- moving and still samples --------------------------------------------------------------------


def test_moving_samples_by_the_recorded_executed_motion() -> None:
    recorded = np.zeros((4, 8, 10))
    recorded[1, :, 0] = 0.002 * np.arange(1, 9)  # 2 mm a step: 8 mm after 4 executed steps
    recorded[2, 4:, 0] = 0.05  # moves only after the executed steps
    recorded[3, :, 9] = 0.0005 * np.arange(1, 9)  # the width opens 2 mm over the executed steps
    moving = moving_samples(recorded, n_action_steps=4, position_mm=5.0, width_mm=1.0)
    assert moving["position_mm"].tolist() == [False, True, False, False]
    assert moving["width_mm"].tolist() == [False, False, False, True]
