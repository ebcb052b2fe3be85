"""End to end: the real `dvc repro` on a copy of this repository and a generated export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.workspace import checkout_copy, run, shorten_training, stages_run

pytestmark = pytest.mark.slow


def test_repro_pairs_the_sample_export_and_reports_every_defect(pipeline_repo: Path) -> None:
    manifest = json.loads((pipeline_repo / "data/manifest.json").read_text())
    metrics = json.loads((pipeline_repo / "metrics/pair.json").read_text())
    report = json.loads((pipeline_repo / "metrics/pair_report.json").read_text())

    assert metrics["recordings_accepted"] == len(manifest["recordings"]) == 3
    exported = {
        p.relative_to(pipeline_repo / "data/raw").as_posix()
        for p in (pipeline_repo / "data/raw").rglob("*")
        if p.is_file()
    }
    in_manifest = {f["path"] for r in manifest["recordings"] for f in r["files"].values()}
    rejected = {r["path"] for r in report["rejected_files"]}
    assert in_manifest | rejected == exported and not in_manifest & rejected  # every file accounted for, once


def test_provenance_of_pair_holds_code_environment_machine_and_hashes(pipeline_repo: Path) -> None:
    prov = json.loads((pipeline_repo / "metrics/provenance/pair.json").read_text())
    head = (pipeline_repo.parent / "code_commit").read_text()
    assert prov["git"]["commit"] == head and prov["git"]["branch"] == "main"
    # The stage's code and params are the commit's: not dirty, though the checkout is (the
    # new data/raw.dvc, and the outputs DVC removed before running the stage).
    assert prov["git"]["dirty"] is False and prov["git"]["dirty_files"] == []
    assert "data/raw.dvc" in prov["git"]["changed_files"]
    assert prov["environment"]["lock"]["sha256"] and prov["environment"]["installed"]["dvc"]
    assert prov["accelerator"]["device"] in ("cpu", "cuda")
    assert prov["host"]["cpu_count"] >= 1
    assert "stages/pair.py" in prov["command"]
    assert prov["params"] | {"robomimic": None, "aloha": None} == {
        "task": "pick_place",
        "accept_truncated": False,
        "hash_workers": 0,
        "source": "mcap",
        "robomimic": None,  # the HDF5 sources' params, recorded too
        "aloha": None,
    }
    assert prov["params"]["robomimic"]["cameras"] == ["agentview_image"]
    assert prov["params"]["aloha"]["control_hz"] is None  # required only when source is aloha
    assert set(prov["inputs_sha256"]) == {"data/raw"}
    assert set(prov["outputs_sha256"]) == {
        "data/manifest.json",
        "metrics/pair_report.json",
        "metrics/pair.json",
    }
    assert prov["duration_s"] >= 0


def test_every_stage_records_its_provenance_with_the_dataset_fingerprint_from_convert_on(
    pipeline_repo: Path,
) -> None:
    fingerprint = json.loads((pipeline_repo / "data/stats/stats.json").read_text())["dataset_fingerprint"][
        "sha256"
    ]
    code_commit = (pipeline_repo.parent / "code_commit").read_text()
    for stage in ("pair", "convert", "stats", "train", "eval"):
        prov = json.loads((pipeline_repo / f"metrics/provenance/{stage}.json").read_text())
        assert prov["stage"] == stage and f"stages/{stage}.py" in prov["command"]
        assert prov["git"]["commit"] == code_commit and "dirty" in prov["git"]
        assert prov["environment"]["lock"]["differences"] == []  # this venv is installed from the lock
        assert prov["accelerator"]["device"] == "cpu" and prov["host"]["hostname"]
        assert prov["params"] and prov["inputs_sha256"] and prov["outputs_sha256"]
        hashes = set(prov["inputs_sha256"].values()) | set(prov["outputs_sha256"].values())
        assert (fingerprint in hashes) == (stage != "pair"), stage
        assert prov["git"]["dirty"] is False, (
            stage,
            prov["git"]["dirty_files"],
        )  # the commit's code and params
    converter = json.loads((pipeline_repo / "metrics/provenance/convert.json").read_text())["details"][
        "converter"
    ]
    assert len(converter["code_sha256"]) == 64 and converter["libraries"]["opencv-python-headless"]


def test_dataset_report_stats_and_verify_after_repro(pipeline_repo: Path) -> None:
    report = json.loads((pipeline_repo / "metrics/dataset.json").read_text())
    stats = json.loads((pipeline_repo / "data/stats/stats.json").read_text())
    assert report["episodes"] == 3
    assert (report["train_episodes"], report["val_episodes"], report["test_episodes"]) == (1, 1, 1)
    assert report["fingerprint"] == stats["dataset_fingerprint"]["sha256"]
    assert set(stats["lowdim"]) == {"action", "action_per_step", "obs.eef_pose_rel", "obs.gripper_width"}
    assert len(stats["lowdim"]["action"]["mean"]) == 10
    assert {p.name for p in (pipeline_repo / "metrics/plots/dataset").iterdir()} == {
        "episode_lengths.png",
        "paths_topdown.png",
        "gripper_width.png",
        "contact_sheet.png",
    }
    out = run(pipeline_repo, "policypipe", "verify", "data/dataset.zarr")
    assert out.startswith("OK data/dataset.zarr")
    for stage in ("pair", "convert", "stats", "train", "eval"):
        assert json.loads((pipeline_repo / f"metrics/provenance/{stage}.json").read_text())["stage"] == stage


def test_second_repro_changes_nothing(pipeline_repo: Path) -> None:
    watched = [
        "data/manifest.json",
        "metrics/pair.json",
        "metrics/pair_report.json",
        "metrics/provenance/pair.json",
        "dvc.lock",
        "metrics/convert.json",
        "metrics/dataset.json",
        "data/stats/stats.json",
        "metrics/provenance/stats.json",
        "metrics/train.json",
        "data/policy/model.safetensors",
        "metrics/provenance/train.json",
        "metrics/eval.json",
        "metrics/eval_per_step.json",
        "metrics/provenance/eval.json",
        "metrics/rollout.json",
        "metrics/provenance/rollout.json",
    ]
    before = {p: (pipeline_repo / p).read_bytes() for p in watched}
    out = run(pipeline_repo, "dvc", "repro")
    assert "didn't change" in out
    assert {p: (pipeline_repo / p).read_bytes() for p in watched} == before
    assert stages_run(out) == ["check_export"]  # the guard, every time; it changes nothing


def test_train_stage_exports_a_policy_with_checkpoints_and_metrics(pipeline_repo: Path) -> None:
    metrics = json.loads((pipeline_repo / "metrics/train.json").read_text())
    assert metrics["steps"] == 6 and metrics["val_loss_first"] > 0 and metrics["samples_per_s"] > 0
    checkpoints = {p.name for p in (pipeline_repo / "data/train/checkpoints").iterdir()}
    assert "latest" in checkpoints and any(n.startswith("executed_error-") for n in checkpoints)
    assert metrics["val_executed_best"]["score"] > 0
    assert run(pipeline_repo, "policypipe", "verify", "data/policy").startswith("OK")
    assert (pipeline_repo / "metrics/train/plots/metrics/train/train_loss.tsv").is_file()
    assert (pipeline_repo / "data/train/log.jsonl").read_text().count("\n") == 6


def test_eval_stage_reports_errors_baselines_and_plots(pipeline_repo: Path) -> None:
    metrics = json.loads((pipeline_repo / "metrics/eval.json").read_text())
    # 3 recordings: one each for training, validation and the test side, the headline.
    assert metrics["headline"] == "test"
    for side in ("test", "validation"):
        report = metrics[side]
        assert report["episodes"] == 1 and report["samples"] > 0 and report["skipped_episodes"] == 0
        assert set(report["ratio_to_hold_still"]) == {"position_mm", "rotation_deg", "width_mm"}
    per_step = json.loads((pipeline_repo / "metrics/eval_per_step.json").read_text())
    assert [row["step"] for row in per_step] == list(range(1, 17))
    assert {p.name for p in (pipeline_repo / "metrics/plots/eval").iterdir()} == {
        "predicted_vs_recorded.png",
        "error_vs_horizon.png",
    }
    shown = run(pipeline_repo, "dvc", "metrics", "show")
    assert "metrics/eval.json" in shown


def test_rollout_stage_reports_the_policy_and_the_references_with_a_contact_sheet_and_a_video(
    pipeline_repo: Path,
) -> None:
    metrics = json.loads((pipeline_repo / "metrics/rollout.json").read_text())
    assert metrics["scenes"]["seeds"] == [0, 1]
    for controller in ("policy", "demonstration_replay", "hold_still"):
        summary = metrics[controller]
        assert summary["episodes"] == 2 and sum(summary["outcomes"].values()) == 2
        assert summary["success_ci95"]["method"] == "Wilson score interval"
    # Half a second is too short for the demonstration; holding still never closes.
    assert metrics["hold_still"]["outcomes"]["never_closed_on_block"] == 2
    plots = sorted(p.name for p in (pipeline_repo / "metrics/plots/rollout").iterdir())
    assert plots[0] == "final_frames.png" and len(plots) == 2 and plots[1].endswith(".mp4")


def test_every_series_dvc_yaml_plots_names_is_in_the_output_with_every_baseline(pipeline_repo: Path) -> None:
    # dvc.yaml named a `camera_ablation` series the output did not have, and left out the
    # strongest baseline: `dvc plots show` drew the policy against the weak ones only.
    import csv

    for plot in yaml.safe_load((pipeline_repo / "dvc.yaml").read_text())["plots"]:
        if not isinstance(plot, dict):
            continue  # an image
        (definition,) = plot.values()
        for path, keys in definition["y"].items():
            keys = [keys] if isinstance(keys, str) else keys
            text = (pipeline_repo / path).read_text()
            rows = (
                json.loads(text)
                if path.endswith(".json")
                else list(csv.DictReader(text.splitlines(), delimiter="\t"))
            )
            missing = [k for k in keys if not all(k in row for row in rows)]
            assert rows and not missing, f"{path}: {missing} named in dvc.yaml's plots, not in the output"
    written = set(json.loads((pipeline_repo / "metrics/eval_per_step.json").read_text())[0]) - {"step"}
    policy_and_baselines = {k for k in written if not k.startswith("camera_ablation")}
    horizon = next(
        p
        for p in yaml.safe_load((pipeline_repo / "dvc.yaml").read_text())["plots"]
        if "position error along the horizon (eval)" in p
    )
    assert (
        set(horizon["position error along the horizon (eval)"]["y"]["metrics/eval_per_step.json"])
        == policy_and_baselines
    )


def test_manifest_is_identical_in_another_checkout_location(pipeline_repo: Path, tmp_path: Path) -> None:
    other = checkout_copy(tmp_path / "somewhere" / "else")
    shorten_training(other)
    shutil.copytree(pipeline_repo / "data/raw", other / "data/raw")
    run(other, "dvc", "repro")
    for output in (
        "data/manifest.json",
        "data/stats/stats.json",
        "metrics/dataset.json",
        "data/policy/model.safetensors",
        "metrics/eval.json",
        "metrics/rollout.json",
    ):
        assert (other / output).read_bytes() == (pipeline_repo / output).read_bytes(), output
