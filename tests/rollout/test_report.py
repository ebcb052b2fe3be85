"""The rollout stage's arithmetic: Wilson intervals, the summary, which episodes become videos."""

from __future__ import annotations

import numpy as np
import pytest

from policypipe.atomic import canonical_json
from policypipe.rollout.episode import EpisodeResult
from policypipe.rollout.report import RolloutStageConfig, summary, video_seeds, wilson_interval


def result(seed: int, outcome: str, duration_s: float = 9.0) -> EpisodeResult:
    return EpisodeResult(seed, outcome, duration_s, 0.01, np.zeros((4, 4, 3), np.uint8), [])


def test_wilson_interval_matches_its_formula_and_never_leaves_zero_to_one() -> None:
    # 8 of 10: the textbook value (Wilson 1927; e.g. Brown, Cai & DasGupta 2001) is [0.490, 0.943].
    low, high = wilson_interval(8, 10)
    assert (round(low, 3), round(high, 3)) == (0.49, 0.943)
    assert wilson_interval(0, 50) == (0.0, pytest.approx(0.0714, abs=1e-4))
    assert wilson_interval(50, 50) == (pytest.approx(0.9286, abs=1e-4), pytest.approx(1.0))


def test_the_summary_counts_outcomes_and_times_only_successes() -> None:
    results = [result(0, "success", 8.0), result(1, "dropped"), result(2, "success", 10.0)]
    s = summary(results)
    assert s["episodes"] == 3 and s["success_rate"] == pytest.approx(2 / 3)
    assert s["outcomes"]["dropped"] == 1 and s["outcomes"]["timed_out"] == 0
    assert s["time_to_success_s"] == {"mean": 9.0, "max": 10.0}
    assert s["grasp_rate"] == pytest.approx(1.0)  # a drop, too, held it first
    assert summary([result(0, "closed_on_nothing"), result(1, "timed_out")])["grasp_rate"] == 0.5
    assert s["seeds"] == {"success": [0, 2], "dropped": [1]}
    assert summary([result(0, "timed_out")])["time_to_success_s"] is None
    assert s["missed_closes"] == {
        "count": 0,
        "median_margin_mm": None,
        "median_margin_deg": None,
        "failed": None,
    }
    missed = result(3, "closed_on_nothing")
    missed.missed_closes.extend(  # NumPy scalars, as the simulator's margins are
        [
            {"depth_m": np.float64(-0.05), "across_m": np.float64(0.01), "square_deg": np.float64(4.0)},
            {"depth_m": np.float64(0.01), "across_m": np.float64(0.03), "square_deg": np.float64(-10.0)},
        ]
    )
    assert summary([missed])["missed_closes"] == {
        "count": 2,
        "median_margin_mm": {"depth": -20.0, "across": 20.0},
        "median_margin_deg": {"square": -3.0},
        "failed": {"depth_m": 1, "across_m": 0, "square_deg": 1},
    }
    canonical_json(summary([missed]))  # metrics/rollout.json: plain JSON numbers only
    assert s["drops"] == {
        "count": 0,
        "over_the_mark": 0,
        "before_the_mark": 0,
        "median_height_mm": None,
        "median_from_mark_mm": None,
    }
    high, early, placed = result(4, "dropped"), result(5, "dropped"), result(6, "success")
    high.releases.append({"height_m": 0.03, "from_mark_m": 0.005, "dropped": True})
    early.releases.append({"height_m": 0.09, "from_mark_m": 0.12, "dropped": True})
    placed.releases.append({"height_m": 0.004, "from_mark_m": 0.006, "dropped": False})
    assert summary([high, early, placed])["drops"] == {
        "count": 2,
        "over_the_mark": 1,
        "before_the_mark": 1,
        "median_height_mm": 60.0,
        "median_from_mark_mm": 62.5,
    }


def test_videos_alternate_failures_and_successes_by_seed() -> None:
    results = [result(0, "dropped"), result(1, "success"), result(2, "dropped"), result(3, "timed_out")]
    # Failures of each kind first: dropped (0), then timed out (3), then the second drop (2).
    assert video_seeds(results, 3) == [0, 1, 3]
    assert video_seeds(results, 4) == [0, 1, 3, 2]
    assert video_seeds(results[:1], 3) == [0]


def test_a_bad_rollout_param_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="episodes"):
        RolloutStageConfig(episodes=0)
    with pytest.raises(ValueError, match="max_speed_m_s"):
        RolloutStageConfig(max_speed_m_s=0.0)
