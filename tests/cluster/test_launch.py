"""How the train stage starts (here, as local processes, or as a Slurm job) and what a segment of
a Slurm job leaves for the provenance: decided from the config and the environment alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from policypipe.cluster import in_job, launch


@pytest.mark.parametrize(
    ("launcher", "processes", "environ", "expected"),
    [
        ("local", 1, {}, "here"),
        ("local", 2, {}, "processes"),
        ("local", 2, {"WORLD_SIZE": "2"}, "here"),  # one of the processes the launcher started
        ("slurm", 1, {}, "slurm"),
        ("slurm", 2, {"WORLD_SIZE": "2"}, "slurm"),  # a local launch does not make a Slurm job
        ("slurm", 2, {in_job.IN_ALLOCATION_ENV: "1", "WORLD_SIZE": "2"}, "here"),
    ],
)
def test_the_stage_launches_once_and_trains_where_it_was_launched(
    launcher: str, processes: int, environ: dict, expected: str
) -> None:
    assert launch.how_to_launch(launcher, processes, environ) == expected


def test_local_processes_run_the_same_command_under_torchs_launcher() -> None:
    command = launch.torchrun_command(2, ["stages/train.py", "--dataset", "d"])
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[3:] == ["--standalone", "--nproc_per_node=2", "stages/train.py", "--dataset", "d"]


def test_a_training_jobs_files_and_logs_go_beside_its_run_folder() -> None:
    assert launch.job_folder(Path("data/train")) == Path("data/train.slurm")  # git-ignored: /data/*.slurm/


def test_each_segment_of_a_job_is_recorded_and_read_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(in_job.SEGMENTS_ENV, raising=False)
    in_job.record_segment()  # outside a Slurm launch: nothing written, nothing to read
    assert in_job.segments_so_far() is None
    monkeypatch.setenv(in_job.SEGMENTS_ENV, str(tmp_path / "segments.jsonl"))
    for restart in ("0", "1"):
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        monkeypatch.setenv("SLURM_RESTART_COUNT", restart)
        in_job.record_segment()
    segments = in_job.segments_so_far()
    assert [(s["job_id"], s["restart_count"]) for s in segments] == [("7", 0), ("7", 1)]
    assert all(s["host"] and s["started_at"] for s in segments)
    assert json.loads((tmp_path / "segments.jsonl").read_text().splitlines()[0])["job_id"] == "7"
