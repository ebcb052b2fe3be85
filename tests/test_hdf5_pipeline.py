"""A pipeline whose source is robomimic HDF5 files, under a real `dvc repro`: pair takes their
inventory, convert reads the demos, train and eval run on them, rollout says why it does not, and
`policypipe lineage` walks from the policy to each demo's file and key."""

from __future__ import annotations

import json

import pytest
import yaml

from policypipe.lineage.hashing import sha256_file
from tests.recordings.robomimic_files import CAMERAS, write_robomimic
from tests.workspace import checkout_copy, run, shorten_training

pytestmark = pytest.mark.slow


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
    params["convert"] |= {"cameras": [0, 1], "on_missing_camera": "mask"}
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
