"""What cannot be read in an export, found before anything tries, and the export's digest that
`pair` depends on instead of the folder: the library, and the stage under a real `dvc repro`,
where DVC would otherwise hang on a named pipe or fail naming no file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from policypipe.recordings.export_check import ExportListing, unversioned_change
from policypipe.recordings.pairing import PairConfig, pair_export
from tests.conftest import write_triplet
from tests.workspace import checkout_copy, env, run


def hazards(export: Path) -> dict[str, str]:
    return {h.path: h.reason.value for h in ExportListing.of(export).hazards()}


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
    counted = ExportListing.of(raw).tracked()
    assert (counted.files, counted.bytes) == (out["nfiles"], out["size"])


def test_the_content_digest_is_pairs_and_an_unchanged_file_is_not_read_again(export: Path, tmp_path) -> None:
    write_triplet(export / "s1", "a")
    write_triplet(export / "s2", "b")
    cache = tmp_path / "hashes.json"
    first = ExportListing.of(export).content(cache)
    assert first.sha256 == pair_export(export, PairConfig()).export_sha256 and first.files == 6
    # Same size and mtime, other bytes: the cache answers, as DVC's state database would.
    status = export / "s1" / "a_vio.json"
    st = status.stat()
    status.write_bytes(status.read_bytes().replace(b'"a', b'"x', 1))
    os.utime(status, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ExportListing.of(export).content(cache) == first
    os.utime(status, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: hashed again
    assert (
        ExportListing.of(export).content(cache).sha256
        == pair_export(export, PairConfig()).export_sha256
        != first.sha256
    )


def test_a_folder_changed_after_dvc_add_is_said_to_be_unversioned(export: Path, tmp_path) -> None:
    repo = tmp_path / "repo"
    write_triplet(repo / "raw" / "s1", "a")
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    run(repo, "dvc", "add", "-q", "raw")
    assert unversioned_change(ExportListing.of(repo / "raw"), repo / "raw.dvc") is None
    write_triplet(repo / "raw" / "s2", "b")
    said = unversioned_change(ExportListing.of(repo / "raw"), repo / "raw.dvc")
    assert "holds 6 files" in said and "records 3" in said and "Run `dvc add" in said


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
    # The whole pipeline, as `make demo` runs it. Before the check, DVC waited on the pipe forever
    # (the timeout is the failure); with the check listed before data/raw among pair's deps, DVC
    # sometimes reached data/raw first (its order is not the list's, run to run): no stage depends
    # on the folder now, so DVC never walks it.
    done = subprocess.run(["dvc", "repro"], cwd=repo, env=env(), capture_output=True, text=True, timeout=120)
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
    # A new recording copied in: pair runs again, and the check says data/raw.dvc is behind.
    # The same sample with one recording more: its first two are these two, byte for byte.
    more = tmp_path / "more"
    run(repo, "policypipe", "sample", str(more), "--recordings", "3", "--seed", "3", "--no-defects")
    for name in ("rec_0003.mcap", "rec_0003_vio.mcap", "rec_0003_vio.json"):
        shutil.copy(more / "session_01" / name, raw / "session_01" / name)
    grown = run(repo, "dvc", "repro", "pair", timeout_s=120)
    assert "Running stage 'pair'" in grown and "Run `dvc add data/raw`" in grown
    assert len(yaml.safe_load((repo / "data/manifest.json").read_text())["recordings"]) == 3


def test_a_damaged_hash_cache_means_hashing_again_not_a_crash(export: Path, tmp_path) -> None:
    write_triplet(export / "s1", "a")
    cache = tmp_path / "hashes.json"
    good = ExportListing.of(export).content(cache)
    cache.write_text('{"s1/a.mcap": 7, "s1/a_vio.mcap": [[1], 2], "s1/a_vio.json": "x"}')
    assert ExportListing.of(export).content(cache) == good
    cache.write_text("not json")
    assert ExportListing.of(export).content(cache) == good
