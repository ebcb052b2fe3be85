"""The monitor's closed-loop figures (`rollout.monitoring`) on episodes with known readings, and the
rollout of a monitored policy keeping its readings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policypipe.monitor.reading import MonitorReading
from policypipe.monitor.scores import Calibration, EmbeddingBank
from policypipe.rollout.episode import EpisodeResult
from policypipe.rollout.monitoring import alarm_times, assess, auroc
from policypipe.rollout.report import RolloutStageConfig, alarmed_frames, report, run_rollouts

# Novelty counts from 1.5, inconsistency from 1.0, two chunks in a row; the longest validation
# recording 10 s.
CALIBRATION = Calibration(
    EmbeddingBank.of(np.eye(4), 1), 1.5, 1.0, 1.0, 2, 0.01, details={"validation_longest_s": 10.0}
)


def episode(seed: int, outcome: str, duration_s: float, alarms_at: tuple[float, ...] = (), peak: float = 0.5):
    """An episode with a chunk every second, alarmed at `alarms_at`, its score `peak` at its highest."""
    readings = tuple(
        (
            float(t),
            MonitorReading(
                peak if t == 1 else 0.1,
                np.nan if t == 0 else 0.2,
                2.0 if t in alarms_at else 0.5,
                t in alarms_at,
            ),
        )
        for t in range(int(duration_s) + 1)
    )
    return EpisodeResult(seed, outcome, duration_s, 0.01, np.zeros((4, 4, 3), np.uint8), [], monitor=readings)


def test_detection_lead_time_false_alarms_and_auroc_are_counted_per_episode_and_per_monitor() -> None:
    policy = [
        episode(0, "dropped", 6.0, alarms_at=(2, 3), peak=3.0),  # alarmed 4 s before it failed
        episode(1, "timed_out", 14.0, alarms_at=(12,), peak=2.0),  # 2 s before
        episode(2, "placed_off_mark", 5.0, peak=0.4),  # missed
        episode(3, "success", 8.0, alarms_at=(5,), peak=1.0),  # a false alarm
        episode(4, "success", 9.0, peak=0.3),
    ]
    replayed = [episode(s, "success", 9.0) for s in range(5)]
    figures = assess(policy, replayed, CALIBRATION)
    combined = figures["alarm"]
    assert combined["detected_failures"]["count"] == 2 and combined["detected_failures"]["of"] == 3
    assert combined["lead_time_s"] == {"median": 3.0, "min": 2.0}
    assert combined["false_alarms_successes"]["count"] == 1 and combined["false_alarms_successes"]["of"] == 2
    assert combined["false_alarms_demonstration_replay"]["count"] == 0
    # Novelty peaks 3.0, 2.0, 0.4 for the failures against 1.0, 0.3: 5 of 6 pairs ordered right.
    assert figures["novelty"]["auroc_failed_vs_successful"] == pytest.approx(5 / 6)
    # Novelty alone never stays above its quantile (1.5) for two chunks in a row: no alarm.
    assert figures["novelty"]["detected_failures"]["count"] == 0
    # The time since the start: 6, 14, 5 against 8, 9; its alarm after the longest validation
    # recording, 10 s: only the time-out, first read at 11 s, 3 s ahead.
    trivial = figures["time_since_start"]
    assert trivial["auroc_failed_vs_successful"] == pytest.approx(2 / 6)
    assert trivial["detected_failures"]["count"] == 1 and trivial["lead_time_s"] == {
        "median": 3.0,
        "min": 3.0,
    }
    assert trivial["false_alarms_successes"]["count"] == 0
    assert assess([dataclasses.replace(e, monitor=()) for e in policy], [], CALIBRATION) is None
    assert assess(policy, replayed, None) is None


def test_a_score_alone_alarms_when_it_stays_above_its_quantile_for_persist_chunks() -> None:
    readings = tuple(
        (float(t), MonitorReading(n, i, 0.5, False))
        for t, (n, i) in enumerate([(2.0, np.nan), (0.1, 5.0), (2.0, 5.0), (2.0, 0.1)])
    )
    times = alarm_times(readings, CALIBRATION)
    assert times["novelty"] == 3.0 and times["inconsistency"] == 2.0 and times["alarm"] is None


def test_auroc_counts_ties_as_half_and_needs_both_kinds() -> None:
    assert auroc([1.0, 2.0], [0.0]) == 1.0 and auroc([1.0], [1.0]) == 0.5
    assert auroc([], [1.0]) is None


def test_a_monitored_policys_episodes_and_the_demonstrations_shadow_keep_their_readings(
    pipeline,
    monitored,
) -> None:
    stage = RolloutStageConfig(episodes=1, first_seed=3, time_limit_s=1.5, videos=0)
    results = run_rollouts(
        monitored, stage, 1, [[]], controllers=("policy", "demonstration_replay", "hold_still")
    )
    (ours,), (replayed,), (still,) = results["policy"], results["demonstration_replay"], results["hold_still"]
    assert len(ours.monitor) >= 2 and len(replayed.monitor) >= 2 and still.monitor == ()
    assert ours.monitor[0][0] == 0.0 and all(b[0] > a[0] for a, b in zip(ours.monitor, ours.monitor[1:]))
    metrics = report(
        results | {"nearest_demonstration_replay": results["hold_still"]}, stage, Calibration.read(monitored)
    )
    assert metrics["monitor"]["chunks"] == len(ours.monitor)
    plain = run_rollouts(pipeline.policy, stage, 1, [[]], controllers=("policy",))["policy"][0]
    assert plain.monitor == () and plain.outcome == ours.outcome and plain.duration_s == ours.duration_s


def test_a_videos_frames_are_marked_from_the_first_alarm_while_it_stands() -> None:
    result = dataclasses.replace(
        episode(0, "dropped", 3.0, alarms_at=(1,)), frame_times_s=(0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
    )
    assert alarmed_frames(result) == [False, False, True, True, False, False]
