"""The runtime monitor measured in closed loop (the rollout stage's `monitor` in metrics/rollout.json).

The policy's runner reads every chunk it is asked for (`monitor.scores`); the rollout keeps the
readings with their times (`Watched`). In the scene's demonstration replayed, the runner reads the
same observations in the shadow, its chunks never executed: a nominal episode of a new scene that
should raise few alarms. Per configuration:

- failed episodes: the share alarmed before the failure (the episode's end: a drop, a placement or
  the time limit) and the lead time, seconds from the first alarm to that end;
- successful episodes: the share alarmed at all (false alarms), and the same for the demonstration
  replayed;
- AUROC for telling failed from successful episodes by each score's largest value over the episode,
  and failed episodes from the demonstration's replays (where the policy seldom succeeds, the
  nominal episodes to tell its failures from).

Each figure for the runner's alarm (`alarm`: its calibration's `alarm_scores`), for each score
alone (the same persistence against its own calibration quantile) and for a trivial monitor, the
time since the start, whose alarm comes once an episode runs longer than the longest validation
recording (`Calibration.details`). A longer episode has more chunks to raise a maximum with, and a
failure by time-out runs longest: the trivial monitor is the bar the scores must clear.

Wilson intervals for the shares (`report.wilson_interval`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class Watched:
    """A controller whose chunks' monitor readings are kept with their times; with a `shadow` (a
    policy runner), the shadow reads each observation and the controller's chunk is executed."""

    def __init__(self, controller, shadow=None) -> None:
        self.controller, self.shadow = controller, shadow
        self.readings: list[tuple[float, Any]] = []
        self.start_ns: int | None = None

    def act(self, observation, now_ns: int | None = None, episode_start_ns: int | None = None):
        chunk = self.controller.act(observation, now_ns=now_ns, episode_start_ns=episode_start_ns)
        watched = (
            chunk if self.shadow is None else self.shadow.act(observation, now_ns, None, episode_start_ns)
        )
        reading = getattr(watched, "monitor", None)  # a reference's chunk has none
        if reading is not None:
            if self.start_ns is None:
                self.start_ns = now_ns
            self.readings.append(((now_ns - self.start_ns) / 1e9, reading))
        return chunk


def first_alarm_s(readings) -> float | None:
    return next((t for t, reading in readings if reading.alarm), None)


def auroc(positives: list[float], negatives: list[float]) -> float | None:
    """P(a positive's value > a negative's), ties counting half (Mann-Whitney); None without both."""
    if not positives or not negatives:
        return None
    p, n = np.asarray(positives, float)[:, None], np.asarray(negatives, float)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))


def episode_maximum(readings, score: str) -> float:
    values = [getattr(reading, score) for _, reading in readings]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else 0.0


def alarm_times(readings, calibration) -> dict[str, float | None]:
    """Each monitor's first alarm in an episode (seconds from its start; None: never): `alarm`, the
    runner's own (its calibration's `alarm_scores`); each score alone with the same persistence
    against its own calibration quantile; the trivial one once the episode has run longer than the
    longest validation recording."""
    times = [t for t, _ in readings]
    out: dict[str, float | None] = {"alarm": first_alarm_s(readings)}
    p = calibration.persist
    for score, quantile in (
        ("novelty", calibration.novelty_quantile),
        ("inconsistency", calibration.inconsistency_quantile),
    ):
        ratio = np.nan_to_num([getattr(r, score) / quantile for _, r in readings], nan=0.0)
        above = [j for j in range(p - 1, len(ratio)) if ratio[j - p + 1 : j + 1].min() > 1.0]
        out[score] = times[above[0]] if above else None
    longest = calibration.details.get("validation_longest_s")
    out["time_since_start"] = next((t for t in times if t > longest), None) if longest is not None else None
    return out


MONITORS = ("alarm", "novelty", "inconsistency", "time_since_start")
# What each monitor's AUROC ranks an episode by: the largest value of its score over the episode.
RANKED_BY = {"alarm": "score", "novelty": "novelty", "inconsistency": "inconsistency"}


def assess(policy, replayed, calibration) -> dict[str, Any] | None:
    """The monitor's figures over the policy's episodes and the demonstration's replays (EpisodeResult
    lists), per monitor (`alarm_times`); None where the policy has no monitor (`calibration`: the
    policy's, `monitor.scores.Calibration`)."""
    if calibration is None or not any(r.monitor for r in policy):
        return None
    alarms = {id(r): alarm_times(r.monitor, calibration) for r in [*policy, *replayed]}
    return {
        "chunks": sum(len(r.monitor) for r in policy),
        "false_alarm_rate": calibration.false_alarm_rate,
        "persist": calibration.persist,
        "alarmed_chunks": {
            "policy": _chunk_share(policy),
            "demonstration_replay": _chunk_share(replayed) if replayed else None,
        },
        "trivial_rule": "time since the start: alarm once the episode runs longer than the longest "
        f"validation recording, {calibration.details.get('validation_longest_s')} s",
    } | monitor_figures(policy, replayed, alarms)


def monitor_figures(policy, replayed, alarms: dict[int, dict[str, float | None]]) -> dict[str, Any]:
    """Per monitor: failures detected and how early, false alarms, AUROC; `alarms`: each episode's
    `alarm_times` by id (several policies' episodes pooled, each judged by its own calibration)."""
    from policypipe.rollout.report import wilson_interval

    def share(hits: int, n: int) -> dict[str, Any]:
        low, high = wilson_interval(hits, n)
        return {"count": hits, "of": n, "rate": hits / n if n else None, "ci95": [low, high]}

    failed = [r for r in policy if r.outcome != "success"]
    succeeded = [r for r in policy if r.outcome == "success"]

    def figures(monitor: str) -> dict[str, Any]:
        lead = [
            r.duration_s - t for r in failed if (t := alarms[id(r)][monitor]) is not None and t < r.duration_s
        ]

        def rank(r) -> float:
            return episode_maximum(r.monitor, RANKED_BY[monitor]) if monitor in RANKED_BY else r.duration_s

        def alarmed(results) -> int:
            return sum(alarms[id(r)][monitor] is not None for r in results)

        return {
            "detected_failures": share(len(lead), len(failed)),
            "lead_time_s": {"median": float(np.median(lead)), "min": float(np.min(lead))} if lead else None,
            "false_alarms_successes": share(alarmed(succeeded), len(succeeded)),
            "false_alarms_demonstration_replay": share(alarmed(replayed), len(replayed))
            if replayed
            else None,
            "auroc_failed_vs_successful": auroc([rank(r) for r in failed], [rank(r) for r in succeeded]),
            # Where the policy seldom succeeds: its failures against the nominal replays of the scenes.
            "auroc_failed_vs_demonstration_replay": auroc(
                [rank(r) for r in failed], [rank(r) for r in replayed]
            ),
        }

    return {monitor: figures(monitor) for monitor in MONITORS}


def _chunk_share(results) -> float | None:
    readings = [reading for r in results for _, reading in r.monitor]
    return sum(reading.alarm for reading in readings) / len(readings) if readings else None
