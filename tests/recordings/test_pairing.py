from __future__ import annotations

import json
import os
import shutil
from pathlib import Path, PurePosixPath

import pytest

from policypipe.atomic import canonical_json
from policypipe.lineage.hashing import sha256_file
from policypipe.recordings.layout import MAX_STATUS_BYTES
from policypipe.recordings.pairing import PairConfig, Reason, pair_export
from tests.conftest import mcap_samples, write_tiny_mcap, write_triplet

CONFIG = PairConfig(task="pick_place")


def reasons(result) -> dict[str, str]:
    return {r.path: r.reason.value for r in result.rejections}


def test_good_triplets_are_paired_with_relative_paths_sizes_and_hashes(export: Path) -> None:
    write_triplet(export / "session_01", "rec_b")
    files = write_triplet(export / "session_02", "rec_a")

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["rec_a", "rec_b"]  # sorted by stem
    assert result.rejections == ()
    entry = result.manifest()["recordings"][0]
    assert entry["folder"] == "session_02"
    assert entry["files"]["raw"] == {
        "path": "session_02/rec_a.mcap",
        "size": files[0].stat().st_size,
        "sha256": sha256_file(files[0]),
    }
    assert entry["files"]["vio"]["path"] == "session_02/rec_a_vio.mcap"
    assert entry["status"]["status"] == "success" and entry["truncated"] is False
    assert str(export) not in canonical_json(result.manifest()).decode()


@pytest.mark.parametrize(
    ("damage", "reason", "bad_file_in_detail"),
    [
        (lambda d: (d / "r_vio.json").unlink(), "not_paired", "r_vio.json"),
        (lambda d: (d / "r.mcap").unlink(), "not_paired", "r.mcap"),
        (lambda d: (d / "r_vio.mcap").write_bytes(b""), "empty", "r_vio.mcap"),
        (
            lambda d: (d / "r_vio.json").write_text('{"source": "r.mcap",\n "status": '),
            "invalid_json",
            "line 2",
        ),
        (lambda d: (d / "r_vio.json").write_text('{"source": "r.mcap"}'), "missing_keys", "output, status"),
        (lambda d: (d / "r_vio.json").write_text("[1, 2]"), "invalid_json", "object"),
        (lambda d: (d / "r_vio.json").write_bytes(b'{"a": "\xff"}'), "invalid_json", "UTF-8"),
        (
            lambda d: (d / "r_vio.json").write_text(
                '{"source": "r.mcap", "output": "r_vio.mcap", "status": NaN}'
            ),
            "invalid_json",
            "NaN",
        ),
        (
            lambda d: _status(d, status="failed", error="VIO lost tracking at 12.4 s"),
            "status_not_success",
            "VIO lost tracking at 12.4 s",
        ),
        (lambda d: _status(d, status="running", error=None), "status_not_success", "no error text"),
        (
            lambda d: _status(d, source="../x.mcap"),
            "source_not_in_folder",
            "'../x.mcap' points outside the recording's",
        ),
        (
            lambda d: _status(d, source="../../x.mcap"),
            "source_not_in_folder",
            "'../../x.mcap' points outside the export",
        ),
        (lambda d: _status(d, output="/etc/passwd"), "source_not_in_folder", "outside the export"),
        (lambda d: _status(d, source="s1/r.mcap"), "source_not_in_folder", "s1/r.mcap"),
        (lambda d: _status(d, source="other.mcap"), "name_mismatch", "other.mcap"),
        (lambda d: _status(d, task="cup_arrangement"), "other_task", "cup_arrangement"),
        (lambda d: (d / "r_vio.mcap").write_bytes(b"<html>502 Bad Gateway</html>"), "not_mcap", "r_vio.mcap"),
        (lambda d: (d / "r.mcap").write_bytes(b"\xff\xd8\xff\xe0JFIF"), "not_mcap", "r.mcap"),
        (lambda d: _truncate(d / "r_vio.mcap"), "truncated", "accept_truncated"),
        (lambda d: _truncate(d / "r.mcap"), "truncated", "r.mcap"),
    ],
)
def test_each_defect_rejects_the_recording_with_its_reason_and_keeps_the_others(
    export: Path, damage, reason: str, bad_file_in_detail: str
) -> None:
    write_triplet(export / "s1", "good")
    write_triplet(export / "s1", "r")
    damage(export / "s1")

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["good"]
    rejected = reasons(result)
    remaining = sorted(p.relative_to(export).as_posix() for p in (export / "s1").glob("r*"))
    assert sorted(rejected) == remaining  # every file of the stem, nothing else
    assert set(rejected.values()) == {reason}
    assert all(bad_file_in_detail in r.detail for r in result.rejections)


def _status(folder: Path, **changes) -> None:
    path = folder / "r_vio.json"
    status = json.loads(path.read_text())
    status.update(changes)
    path.write_text(json.dumps(status))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def test_truncated_vio_is_accepted_with_a_flag_when_configured(export: Path) -> None:
    write_triplet(export, "r")
    _truncate(export / "r_vio.mcap")

    result = pair_export(export, PairConfig(task="pick_place", accept_truncated=True))

    assert [(r.stem, r.truncated) for r in result.recordings] == [("r", True)]
    assert result.metrics()["recordings_truncated_accepted"] == 1


def test_leftovers_and_strangers_are_reported_and_do_not_disturb_pairing(export: Path) -> None:
    write_triplet(export, "r")
    write_tiny_mcap(export / "r_vio (1).mcap")
    write_tiny_mcap(export / "r_vio_retry2.mcap")
    (export / "r_vio.mcap.partial").write_bytes(b"\x89MCAP0\r\n")
    (export / "r_vio.mcap.tmp").write_bytes(b"x")
    (export / "notes.txt").write_text("calibration ok")

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["r"]
    assert reasons(result) == {
        "notes.txt": "not_an_input",
        "r_vio (1).mcap": "not_an_input",
        "r_vio_retry2.mcap": "not_an_input",
        "r_vio.mcap.partial": "not_an_input",
        "r_vio.mcap.tmp": "not_an_input",
    }
    detail = {r.path: r.detail for r in result.rejections}
    assert "retry leftover of recording 'r'" in detail["r_vio (1).mcap"]
    assert "partial" in detail["r_vio.mcap.partial"]


def test_duplicate_stem_in_two_folders_rejects_both_and_names_both(export: Path) -> None:
    write_triplet(export / "a", "same")
    write_triplet(export / "b", "same")
    write_triplet(export / "b", "other")

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["other"]
    assert len(result.rejections) == 6
    assert {r.reason for r in result.rejections} == {Reason.DUPLICATE_STEM}
    assert all("a/ and b/" in r.detail for r in result.rejections)


def test_task_is_only_checked_when_configured_and_present(export: Path) -> None:
    write_triplet(export, "x", task="other")
    write_triplet(export, "y", task=None)
    (export / "z").mkdir()
    write_triplet(export / "z", "z")
    status = json.loads((export / "z" / "z_vio.json").read_text())
    del status["task"]
    (export / "z" / "z_vio.json").write_text(json.dumps(status))

    assert [r.stem for r in pair_export(export, PairConfig(task=None)).recordings] == ["x", "y", "z"]
    assert [r.stem for r in pair_export(export, CONFIG).recordings] == ["y", "z"]


def test_symlinks_leading_outside_are_reported_not_followed(export: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    write_triplet(outside, "far")
    write_triplet(export, "near")
    for name in ("far.mcap", "far_vio.mcap", "far_vio.json"):
        os.symlink(outside / name, export / name)
    os.symlink(outside, export / "linked_folder")
    os.symlink(export / "nowhere", export / "dangling_vio.json")
    os.symlink(export / "near_vio.json", export / "alias.json")  # inside: a file like any other

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["near"]
    got = reasons(result)
    assert got["far.mcap"] == got["far_vio.mcap"] == got["linked_folder"] == "symlink_outside_export"
    assert got["dangling_vio.json"] == "symlink_not_followed"
    assert got["alias.json"] == "not_an_input"


def test_manifest_is_byte_identical_across_runs_and_locations(export: Path, tmp_path: Path) -> None:
    for i in range(6):
        write_triplet(export / f"s{i % 2}", f"rec_{i}")
    (export / "junk.bin").write_bytes(os.urandom(10))
    elsewhere = tmp_path / "deeper" / "copy_of_export"
    shutil.copytree(export, elsewhere)

    first = pair_export(export, CONFIG)
    again = pair_export(export, PairConfig(task="pick_place", hash_workers=1))
    moved = pair_export(elsewhere, CONFIG)

    assert (
        canonical_json(first.manifest())
        == canonical_json(again.manifest())
        == canonical_json(moved.manifest())
    )
    assert canonical_json(first.report()) == canonical_json(moved.report())
    assert first.export_sha256 == moved.export_sha256


def test_missing_export_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pair_export(tmp_path / "nope", CONFIG)


def test_real_public_mcap_files_are_paired_or_rejected_never_a_crash(export: Path) -> None:
    samples = sorted(mcap_samples().rglob("*.mcap"))
    assert len(samples) >= 15, f"expected the 15 shared MCAP samples or more, found {len(samples)}"
    # The known-corrupt variant: a CR byte stripped from the magic, as git's eol rules do.
    crlf_damaged = samples[0].read_bytes().replace(b"\r\n", b"\n", 1)
    for i, sample in enumerate(samples):
        write_triplet(export, f"real_{i:02d}")
        shutil.copyfile(sample, export / f"real_{i:02d}_vio.mcap")
    write_triplet(export, "eol_damaged")
    (export / "eol_damaged_vio.mcap").write_bytes(crlf_damaged)

    result = pair_export(export, CONFIG)

    assert len(result.recordings) == len(samples)  # all well-formed MCAP: pairing does not decode
    assert reasons(result) == {
        f"eol_damaged{suffix}": "not_mcap" for suffix in (".mcap", "_vio.mcap", "_vio.json")
    }


SAMPLE_DEFECT_REASONS = {
    "status_failed": "status_not_success",
    "missing_json": "not_paired",
    "empty_vio": "empty",
    "retry_leftover": "not_an_input",
    "partial_leftover": "not_an_input",
    "other_task": "other_task",
    "invalid_json": "invalid_json",
    "source_outside": "source_not_in_folder",
    "duplicate_stem": "duplicate_stem",
    "truncated_vio": "truncated",
    "not_mcap": "not_mcap",
}


def test_sample_export_every_defect_rejected_with_its_reason_and_nothing_else(tmp_path: Path) -> None:
    from policypipe.synthetic.export import SampleConfig, write_sample_export

    sample = write_sample_export(
        tmp_path / "raw", SampleConfig(recordings=3, seed=5, image_width=96, image_height=72)
    )
    assert set(sample.defects) == set(SAMPLE_DEFECT_REASONS)

    result = pair_export(sample.root, CONFIG)

    assert [r.stem for r in result.recordings] == sorted(sample.good_stems)
    expected = {path: SAMPLE_DEFECT_REASONS[name] for name, paths in sample.defects.items() for path in paths}
    assert reasons(result) == expected
    failed = next(r for r in result.rejections if r.reason is Reason.STATUS_NOT_SUCCESS)
    assert "status 'failed': " in failed.detail and len(failed.detail) > len("status 'failed': ") + 5

    lenient = pair_export(sample.root, PairConfig(task="pick_place", accept_truncated=True))
    assert [r.stem for r in lenient.recordings if r.truncated] == [
        PurePosixPath(sample.defects["truncated_vio"][0]).name.split("_vio")[0].removesuffix(".mcap")
    ]


# --- exports that used to crash `pair` (issue 11): each is one rejection, the rest pairs as before


def test_names_that_are_not_utf8_are_rejected_with_an_escaped_path_and_the_report_is_json(
    export: Path,
) -> None:
    write_triplet(export / "s1", "good")
    raw_export = os.fsencode(export)
    with open(os.path.join(raw_export, b"bad\xffname.mcap"), "wb") as f:
        f.write(b"x")
    bad_folder = os.path.join(raw_export, b"session\xfe")
    os.mkdir(bad_folder)
    write_triplet(Path(os.fsdecode(bad_folder)), "inside")  # the folder is rejected as one entry

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["good"]
    assert reasons(result) == {"bad\\xffname.mcap": "name_not_utf8", "session\\xfe": "name_not_utf8"}
    assert all("not valid UTF-8" in r.detail and "rename" in r.detail for r in result.rejections)
    for document in (result.manifest(), result.report(), result.metrics()):
        json.loads(canonical_json(document))
    assert result.metrics()["files_seen"] == 3 + 2


def test_symlink_loops_and_links_to_an_enclosing_folder_are_rejected_not_walked(export: Path) -> None:
    write_triplet(export / "s1", "good")
    os.symlink("b_vio.mcap", export / "a_vio.mcap")
    os.symlink("a_vio.mcap", export / "b_vio.mcap")
    os.symlink(".", export / "s1" / "here")
    os.symlink("..", export / "s1" / "up")  # the export itself
    os.symlink("../..", export / "s1" / "above")  # the folder holding the export

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["good"]
    assert reasons(result) == {
        "a_vio.mcap": "symlink_loop",
        "b_vio.mcap": "symlink_loop",
        "s1/above": "symlink_loop",
        "s1/here": "symlink_loop",
        "s1/up": "symlink_loop",
    }
    assert all("loop" in r.detail for r in result.rejections)
    assert result.metrics()["files_seen"] == 3 + 5


def test_status_json_nested_too_deeply_to_parse_is_invalid_json(export: Path) -> None:
    write_triplet(export, "good")
    write_triplet(export, "r")
    (export / "r_vio.json").write_text("[" * 100_000)

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["good"]
    assert reasons(result) == {
        "r.mcap": "invalid_json",
        "r_vio.mcap": "invalid_json",
        "r_vio.json": "invalid_json",
    }
    assert all("nested too deeply" in r.detail for r in result.rejections)


def test_status_json_over_the_size_limit_is_rejected_even_when_valid(export: Path) -> None:
    write_triplet(export, "good")
    write_triplet(export, "r")
    path = export / "r_vio.json"
    text = path.read_text()
    path.write_text(text + " " * (MAX_STATUS_BYTES + 1 - len(text)))  # trailing blanks: still valid JSON

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["good"]
    assert reasons(result) == {"r.mcap": "too_large", "r_vio.mcap": "too_large", "r_vio.json": "too_large"}
    assert all(f"{MAX_STATUS_BYTES} bytes" in r.detail for r in result.rejections)


def test_only_documented_status_fields_of_the_documented_type_reach_the_manifest(export: Path) -> None:
    documented = {
        "started_at": "2026-11-03T09:12:44Z",
        "finished_at": "2026-11-03T09:14:02Z",
        "studio_version": "2.4.1",
    }
    write_triplet(export, "r", **documented, frames=[1, 2], comment="x" * 10_000, nested={"a": [[[1]]]})

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["r"]
    assert result.manifest()["recordings"][0]["status"] == {
        "source": "r.mcap",
        "output": "r_vio.mcap",
        "status": "success",
        "error": None,
        "task": "pick_place",
        **documented,
    }  # `frames` is not a count: left out, so `convert` has no wrong number to check against


def test_recordings_with_identical_vio_bytes_keep_the_first_stem_and_reject_the_others(export: Path) -> None:
    write_triplet(export, "rec_a")
    original = write_triplet(export / "s1", "rec_m")[1]
    write_triplet(export / "s2", "rec_c")
    shutil.copyfile(original, export / "s2" / "rec_c_vio.mcap")  # a copy, first in stem order: kept
    write_triplet(export / "s2", "rec_x")
    (export / "s2" / "rec_x_vio.mcap").unlink()
    os.link(original, export / "s2" / "rec_x_vio.mcap")
    write_triplet(export / "s2", "rec_y")
    (export / "s2" / "rec_y_vio.mcap").unlink()
    os.symlink("../s1/rec_m_vio.mcap", export / "s2" / "rec_y_vio.mcap")

    result = pair_export(export, CONFIG)

    assert [r.stem for r in result.recordings] == ["rec_a", "rec_c"]
    assert reasons(result) == {
        f"{folder}/{stem}{suffix}": "duplicate_recording"
        for folder, stem in (("s1", "rec_m"), ("s2", "rec_x"), ("s2", "rec_y"))
        for suffix in (".mcap", "_vio.mcap", "_vio.json")
    }
    assert all("'rec_c'" in r.detail and "s2/rec_c_vio.mcap" in r.detail for r in result.rejections)
    metrics = result.metrics()
    assert metrics["recordings_accepted"] == 2
    assert metrics["recording_stems_rejected"] == 3
    assert metrics["files_rejected_by_reason"] == {"duplicate_recording": 9}


def test_a_named_pipe_is_rejected_without_blocking_the_walk(export: Path) -> None:
    write_triplet(export, "good")
    os.mkfifo(export / "stream_vio.mcap")
    result = pair_export(export, CONFIG)
    assert [r.stem for r in result.recordings] == ["good"]
    assert reasons(result)["stream_vio.mcap"] == "unreadable"


def pair_without_privileges(export: Path) -> dict[str, str] | str:
    """`reasons(pair_export(export))` as a user without root's right to list any folder: in a forked
    child that drops to `nobody` when the tests run as root (CI does), in this process otherwise.
    A PermissionError comes back as its message."""

    def run() -> dict[str, str] | str:
        try:
            return reasons(pair_export(export, CONFIG))
        except PermissionError as exc:
            return str(exc)

    if os.geteuid() != 0:
        return run()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, pair, send the result, exit without pytest's cleanup
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            with os.fdopen(write_end, "w") as out:
                json.dump(run(), out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as got:
        result = got.read()
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(result)


@pytest.fixture
def world_readable_export():
    # pytest's tmp_path lies under a folder only its owner may enter: nobody could not reach it.
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="policypipe-perm-"))
    base.chmod(0o755)
    yield base / "export"
    for folder in base.rglob("*"):
        if folder.is_dir():
            folder.chmod(0o755)
    shutil.rmtree(base)


def test_a_folder_that_cannot_be_listed_is_reported_not_skipped(world_readable_export: Path) -> None:
    export = world_readable_export
    write_triplet(export / "session_01", "good")
    write_triplet(export / "locked", "hidden")
    for path in export.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    export.chmod(0o755)
    (export / "locked").chmod(0o000)
    found = pair_without_privileges(export)
    assert found == {"locked": "unreadable"}, found


def test_an_export_that_cannot_be_listed_is_an_error_naming_it(world_readable_export: Path) -> None:
    export = world_readable_export
    write_triplet(export, "good")
    export.chmod(0o000)
    found = pair_without_privileges(export)
    assert isinstance(found, str) and f"export folder {export.resolve()} cannot be listed" in found
