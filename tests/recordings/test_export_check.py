"""What DVC cannot hash in an export, found before it tries: the library, and the stage under a real
`dvc repro`, where DVC would otherwise hang on a named pipe or fail naming no file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from policypipe.recordings.export_check import export_hazards, tracked_files
from tests.conftest import write_triplet
from tests.workspace import checkout_copy, env, run


def hazards(export: Path) -> dict[str, str]:
    return {h.path: h.reason.value for h in export_hazards(export)}


def test_a_pipe_a_link_loop_a_dangling_link_and_a_name_not_utf8_are_hazards(export: Path) -> None:
    write_triplet(export / "s1", "good")
    os.mkfifo(export / "s1" / "live_vio.mcap")
    (export / "loop_a").symlink_to("loop_b")
    (export / "loop_b").symlink_to("loop_a")
    (export / "gone.mcap").symlink_to("nowhere.mcap")
    (export / os.fsdecode(b"bad\xffname_vio.json")).write_text("{}")
    assert hazards(export) == {
        "s1/live_vio.mcap": "unreadable",
        "loop_a": "symlink_loop",
        "loop_b": "symlink_loop",
        "gone.mcap": "unreadable",
        "bad\\xffname_vio.json": "name_not_utf8",
    }


def test_what_pair_rejects_but_dvc_can_hash_is_no_hazard(export: Path, tmp_path: Path) -> None:
    write_triplet(export / "s1", "good")
    (export / "notes.txt").write_text("a note")  # not an input: pair reports it
    (tmp_path / "outside.mcap").write_bytes(b"x" * 10)
    (export / "outside.mcap").symlink_to(tmp_path / "outside.mcap")  # DVC copies what it leads to
    (export / "s1_again").symlink_to("s1")  # DVC does not follow links to folders
    (export / "here").symlink_to(".")  # nor this loop through a folder link
    assert hazards(export) == {}


def test_the_file_count_and_bytes_are_what_dvc_records(export: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    raw = repo / "raw"
    write_triplet(raw / "s1", "a")
    write_triplet(raw / "s2", "b")
    (tmp_path / "outside.bin").write_bytes(b"y" * 1234)
    (raw / "outside.bin").symlink_to(tmp_path / "outside.bin")
    (raw / "s1_link").symlink_to("s1")
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    run(repo, "dvc", "add", "-q", "raw")
    out = yaml.safe_load((repo / "raw.dvc").read_text())["outs"][0]
    counted = tracked_files(raw)
    assert (counted.files, counted.bytes) == (out["nfiles"], out["size"])


@pytest.mark.slow
def test_dvc_repro_stops_at_the_check_naming_each_entry_instead_of_hanging(tmp_path: Path) -> None:
    repo = checkout_copy(tmp_path / "checkout")
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "2", "--seed", "3", "--no-defects")
    run(repo, "dvc", "add", "--quiet", "data/raw")
    raw = repo / "data/raw"
    os.mkfifo(raw / "live_vio.mcap")
    (raw / "loop_a.mcap").symlink_to("loop_b.mcap")
    (raw / "loop_b.mcap").symlink_to("loop_a.mcap")
    (raw / os.fsdecode(b"take\xff_vio.json")).write_text("{}")
    # On the code before the check, DVC waited on the pipe forever: the timeout is the failure.
    done = subprocess.run(
        ["dvc", "repro", "pair"], cwd=repo, env=env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    for named in ("data/raw/live_vio.mcap", "data/raw/loop_a.mcap", "data/raw/take\\xff_vio.json"):
        assert named in done.stderr, done.stderr
    assert "named pipe" in done.stderr and "link loop" in done.stderr and "not valid UTF-8" in done.stderr
    assert not (repo / "data/manifest.json").exists()

    for entry in ("live_vio.mcap", "loop_a.mcap", "loop_b.mcap", os.fsdecode(b"take\xff_vio.json")):
        (raw / entry).unlink()
    run(repo, "dvc", "repro", "pair", timeout_s=120)
    manifest = yaml.safe_load((repo / "data/manifest.json").read_text())
    assert len(manifest["recordings"]) == 2
    # The check's output depends only on the export: a second repro runs the check, not pair.
    again = run(repo, "dvc", "repro", "pair", timeout_s=120)
    assert "Running stage 'check_export'" in again and "Stage 'pair' didn't change" in again
