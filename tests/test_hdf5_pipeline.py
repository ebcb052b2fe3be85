"""Pipelines whose source is HDF5 files (robomimic; ALOHA, in joint space), under a real `dvc repro`:
pair takes their inventory, convert reads the demos, train and eval run on them, rollout says why it
does not, and `policypipe lineage` walks from the policy to each demo's file and key."""

from __future__ import annotations

import json

import pytest
import yaml

from policypipe.lineage.hashing import sha256_file
from tests.recordings.aloha_files import write_aloha
from tests.recordings.robomimic_files import CAMERAS, write_robomimic
from tests.workspace import checkout_copy, run, shorten_training

pytestmark = pytest.mark.slow


def without_the_labels(params: dict) -> None:
    """The demo's params teach the encoder each recording's grasps and releases; these demos have
    none to teach, and the refusal says to set these (dataset/events.py, WITHOUT_THE_LABELS)."""
    params["train"] |= {"encoder_pretrain_steps": 0, "freeze_encoder": False}
    params["train"]["model"] |= {"event_loss_weight": 0.0, "event_loss_near_m": 0.0}


def test_dvc_repro_runs_end_to_end_on_robomimic_files_with_lineage_to_each_demo(tmp_path) -> None:
    repo = checkout_copy(tmp_path / "checkout")
    shorten_training(repo)
    raw = repo / "data" / "raw"
    raw.mkdir(parents=True)
    # Non-contiguous numbering; demo 4 lacks the wrist camera (masked); a file that is not HDF5.
    write_robomimic(
        raw / "lift.hdf5", {n: 40 for n in (0, 1, 2, 4, 7, 9, 12, 20)}, without={4: (CAMERAS[1],)}
    )
    (raw / "lift_copy.hdf5.partial").write_bytes(b"half a copy")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["pair"] |= {"source": "robomimic", "robomimic": {"cameras": list(CAMERAS)}}
    # The demo's 10 Hz is the sample's step rate; an import keeps its own control rate (interop.md).
    params["convert"] |= {"cameras": [0, 1], "on_missing_camera": "mask", "resample_hz": None}
    without_the_labels(params)  # these demos close the fingers and never open them, as Lift's
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "dvc", "add", "--quiet", "data/raw")

    out = run(repo, "dvc", "repro")

    assert "paired 8 recordings; rejected 0 demos and 1 of 2 files" in out
    assert "converted 8 episodes, 320 frames at 20.00 Hz" in out
    report = json.loads((repo / "metrics/pair_report.json").read_text())
    assert report["rejected_files"][0]["path"] == "lift_copy.hdf5.partial"
    evaluation = json.loads((repo / "metrics/eval.json").read_text())
    headline = evaluation[evaluation["headline"]]
    for scored in ("policy", "constant_velocity", "nearest_neighbour", "hold_still"):
        assert headline[scored]["position_mm"]["executed"]["mean"] > 0
    rollout = json.loads((repo / "metrics/rollout.json").read_text())
    assert "imported from robomimic HDF5 files" in rollout["not_run"]

    lineage = run(repo, "policypipe", "lineage", "data/policy")
    digest = sha256_file(raw / "lift.hdf5")
    for n in (0, 4, 20):
        assert f"{digest}  lift.hdf5  data/demo_{n}" in lineage
    assert run(repo, "dvc", "status").count("changed") <= 1  # check_export: always changed


def test_dvc_repro_trains_and_evaluates_a_joint_space_policy_on_aloha_files(tmp_path) -> None:
    repo = checkout_copy(tmp_path / "checkout")
    shorten_training(repo)
    raw = repo / "data" / "raw"
    raw.mkdir(parents=True)
    for i in range(8):
        write_aloha(raw / f"episode_{i}.hdf5", 36 + 2 * i, seed=i, images="vlen" if i % 2 else "raw")
    (raw / "episode_8.hdf5").write_text("not hdf5")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["pair"] |= {
        "source": "aloha",
        "aloha": {"control_hz": 50, "cameras": ["cam_high", "cam_left_wrist"]},
    }
    params["convert"] |= {"cameras": [0, 1], "resample_hz": None}  # rows are its control steps
    without_the_labels(params)  # joint space: no gripper poses to label grasps and releases with
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "dvc", "add", "--quiet", "data/raw")

    out = run(repo, "dvc", "repro")

    assert "converted 8 episodes" in out and "at 50.00 Hz" in out
    stats = json.loads((repo / "data/stats/stats.json").read_text())
    assert stats["joints"]["grippers"] == ["left_gripper", "right_gripper"]
    assert len(stats["lowdim"]["obs.joint_state"]["mean"]) == 14
    runtime = json.loads((repo / "data/policy/runtime.json").read_text())
    assert runtime["joint_names"] == stats["joints"]["names"] and len(runtime["command_ranges"]) == 14
    evaluation = json.loads((repo / "metrics/eval.json").read_text())
    assert evaluation["representation"] == "joint"
    headline = evaluation[evaluation["headline"]]
    for scored in ("policy", "hold_still", "mean_motion", "constant_velocity", "nearest_neighbour"):
        assert headline[scored]["joints"]["executed"]["mean"] > 0
        assert headline[scored]["grippers"]["executed"]["mean"] >= 0
    assert headline["best_baseline"]["joints"] in (
        "hold_still",
        "mean_motion",
        "constant_velocity",
        "nearest_neighbour",
    )
    assert set(headline["per_joint_executed"]["policy"]) == set(stats["joints"]["names"])
    assert (repo / "metrics/plots/eval/predicted_vs_recorded.png").is_file()
    assert (repo / "metrics/plots/dataset/joint_positions.png").is_file()
    rollout = json.loads((repo / "metrics/rollout.json").read_text())
    assert "imported from aloha HDF5 files" in rollout["not_run"]

    lineage = run(repo, "policypipe", "lineage", "data/policy")
    for i in (0, 7):
        assert f"{sha256_file(raw / f'episode_{i}.hdf5')}  episode_{i}.hdf5" in lineage
