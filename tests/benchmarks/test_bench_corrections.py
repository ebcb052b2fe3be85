"""The DAgger benchmark's table: what docs/rollout.md shows of its results.json."""

from __future__ import annotations

from policypipe.rollout.report import wilson_interval
from tests.benchmarks.bench_corrections import table


def point(seed: int, round_: int, outcomes: list[str], recordings: int) -> dict:
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    return {
        "seed": seed,
        "round": round_,
        "recordings": recordings,
        "success_rate": outcomes.count("success") / len(outcomes),
        "grasp_rate": sum(o != "never_closed_on_block" for o in outcomes) / len(outcomes),
        "outcomes": counts,
        "episode_outcomes": outcomes,
    }


def rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()[2:]]


def test_one_row_a_round_with_each_seed_and_the_pooled_interval() -> None:
    scenes = 4
    plain = {
        "points": {
            # Out of order on purpose: rows go by round, seeds within a row by seed.
            "seed1/round1": point(1, 1, ["success"] * 2 + ["dropped"] * 2, 140),
            "seed0/round0": point(0, 0, ["success"] + ["never_closed_on_block"] * 3, 96),
            "seed1/round0": point(1, 0, ["never_closed_on_block"] * scenes, 96),
            "seed0/round1": point(0, 1, ["success"] + ["dropped"] * 3, 150),
        }
    }
    recovery = {"points": {"seed0/round0": point(0, 0, ["success"] * 3 + ["timed_out"], 96)}}
    del recovery["points"]["seed0/round0"]["episode_outcomes"]  # measured before they were kept

    measured = rows(table({"demonstrations": plain, "recovery": recovery}))

    assert [r[0] for r in measured] == [
        "demonstrations",
        "demonstrations and 1 round of corrections",
        "recovery",
    ]
    round0, round1, recovery_row = measured
    assert round0[1:3] == ["96, 96", "25%, 0%"]
    assert round1[1:3] == ["150, 140", "25%, 50%"]
    low, high = wilson_interval(3, 8)  # both seeds' 8 episodes of round 1, 3 of them won
    assert round1[4] == f"[{100 * low:.1f}, {100 * high:.1f}]"
    assert round1[3].startswith("37.5 % [") and round0[3].startswith("12.5 % [")
    assert round0[5] == "12%" and round1[5] == "100%"  # 1 of 8 grasped, then all
    assert round1[6] == "5 dropped, 3 success"
    assert recovery_row[3] == "75.0 %"  # no interval over scenes without each episode's outcome


def test_an_interval_over_seeds_and_scenes_holds_the_mean() -> None:
    outcomes = [["success", "dropped", "success", "timed_out", "dropped"], ["dropped"] * 4 + ["success"]]
    measured = rows(table({"d": {"points": {f"s{i}": point(i, 0, o, 96) for i, o in enumerate(outcomes)}}}))
    mean, interval = measured[0][3].split(" % ")
    low, high = (float(x) for x in interval.strip("[]").split(", "))
    assert float(mean) == 30.0 and 0 <= low < 30.0 < high <= 100
