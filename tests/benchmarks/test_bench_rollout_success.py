"""Seeds measured one at a time, pooled from their result files (`bench_rollout_success --pool`)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmarks import bench_rollout_success

SETTINGS = {
    "scenes": [1000, 1003],
    "latency_ms": 0.0,
    "compensate_latency": True,
    "hold_grip": True,
    "max_speed_m_s": None,
}


def seed_file(tmp_path, name: str, outcomes: list[str], **settings) -> str:
    """A result file as one `--config NAME POLICY` run writes it (the fields pooling reads)."""
    entry = {"success_rate": outcomes.count("success") / len(outcomes), "scene_outcomes": outcomes}
    results = {**SETTINGS, **settings, "configs": {name: {"policies": {f"runs/{name}/policy": entry}}}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(results))
    return str(path)


def pool(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_rollout_success", "--pool", *argv])
    bench_rollout_success.main()


def test_seeds_run_apart_pool_into_one_configuration_over_all_their_episodes(tmp_path, monkeypatch) -> None:
    first = seed_file(tmp_path, "seed0", ["success", "success", "dropped", "closed_on_nothing"])
    second = seed_file(tmp_path, "seed1", ["success", "placed_off_mark", "success", "success"])
    out = tmp_path / "pooled.json"
    pool(monkeypatch, "plain", first, second, "--out", str(out))

    results = json.loads(out.read_text())
    assert {k: results[k] for k in SETTINGS} == SETTINGS
    plain = results["configs"]["plain"]
    assert plain["success_rate"] == 5 / 8
    assert plain["grasped"] == 7 / 8  # closing on nothing is no grasp
    assert plain["ci95"][0] <= 5 / 8 <= plain["ci95"][1]
    assert plain["pooled_wilson_ci95"][0] < 5 / 8 < plain["pooled_wilson_ci95"][1]
    assert set(plain["policies"]) == {"runs/seed0/policy", "runs/seed1/policy"}
    assert plain["ci_method"] == "percentile bootstrap over 2 seeds, then 4 scenes"


def test_files_run_under_other_settings_or_without_outcomes_are_refused_in_words(
    tmp_path, monkeypatch, capsys
) -> None:
    plain = seed_file(tmp_path, "seed0", ["success"] * 4)
    delayed = seed_file(tmp_path, "seed1", ["success"] * 4, latency_ms=60.0)
    with pytest.raises(SystemExit, match="latency_ms.*pool like with like"):
        pool(monkeypatch, "mixed", plain, delayed)
    with pytest.raises(SystemExit):  # argparse's usage error: a name and no files
        pool(monkeypatch, "alone")
    assert "--pool alone: name the result files of its seeds" in capsys.readouterr().err

    older = tmp_path / "older.json"
    results = json.loads((tmp_path / "seed0.json").read_text())
    del results["configs"]["seed0"]["policies"]["runs/seed0/policy"]["scene_outcomes"]
    older.write_text(json.dumps(results))
    with pytest.raises(SystemExit, match="no scene_outcomes .*: run it again"):
        pool(monkeypatch, "old", str(older))
    with pytest.raises(SystemExit, match="in two of the files"):
        pool(monkeypatch, "twice", plain, plain)
