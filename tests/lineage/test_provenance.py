from __future__ import annotations

import json
import subprocess
from pathlib import Path

from policypipe.lineage.hashing import sha256_file
from policypipe.lineage.provenance import StageRun, read_lock

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(root: Path, *args: str) -> str:
    import os

    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env=os.environ | GIT_ENV).stdout


def make_repo(root: Path, lock: str) -> None:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "requirements.lock").write_text(lock)
    (root / "in.txt").write_text("input")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "init")


def test_record_holds_code_environment_host_command_params_and_hashes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_repo(root, "numpy==0.0.1\n    # via policypipe\npyyaml==6.0.3 \\\n    --hash=sha256:00\n")
    (root / "in.txt").write_text("changed input")  # a dirty tracked file
    (root / "out.json").write_text("{}")

    with StageRun("pair", params={"task": "pick_place"}, root=root) as run:
        run.add_inputs(["in.txt"])
        run.add_outputs(["out.json"])
    record = run.write(root / "prov" / "pair.json")

    on_disk = json.loads((root / "prov" / "pair.json").read_text())
    assert on_disk == record
    assert record["stage"] == "pair" and record["params"] == {"task": "pick_place"}
    assert "pytest" in record["command"] or "python" in record["command"]
    assert record["inputs_sha256"] == {"in.txt": sha256_file(root / "in.txt")}
    assert record["outputs_sha256"] == {"out.json": sha256_file(root / "out.json")}
    assert record["duration_s"] >= 0 and record["started_at"] <= record["ended_at"]

    g = record["git"]
    assert g["commit"] == git(root, "rev-parse", "HEAD").strip() and g["branch"] == "main"
    assert g["dirty"] is True and "in.txt" in g["changed_files"] and "out.json" in g["changed_files"]
    assert len(g["diff_sha256"]) == 64

    env = record["environment"]
    assert env["lock"]["sha256"] == sha256_file(root / "requirements.lock")
    diffs = {d["package"]: d for d in env["lock"]["differences"]}
    assert diffs["numpy"]["lock"] == "0.0.1" and diffs["numpy"]["installed"] not in (None, "0.0.1")
    assert "pytest" in diffs and diffs["pytest"]["lock"] is None  # installed, not in this lock
    assert "torch" in env["installed"]

    acc = record["accelerator"]
    assert acc["torch"].startswith("2.13.0")
    assert acc["device"] in ("cpu", "cuda") and isinstance(acc["gpus"], list)
    host = record["host"]
    assert host["hostname"] and host["cpu_count"] >= 1 and host["memory_bytes"] > 0


def test_clean_checkout_is_not_dirty_and_outside_git_says_so(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_repo(root, "")
    with StageRun("s", params={}, root=root) as run:
        pass
    assert run.record()["git"]["dirty"] is False
    assert run.record()["git"]["diff_sha256"] is None

    loose = tmp_path / "loose"
    loose.mkdir()
    assert StageRun("s", params={}, root=loose).record()["git"]["available"] is False


def test_lock_parser_reads_pins_and_ignores_comments_and_hashes(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# header\nDVC-SSH==4.3.0\n    # via x\nzarr==3.1.6 \\\n    --hash=sha256:ab\n")
    assert read_lock(lock) == {"dvc-ssh": "4.3.0", "zarr": "3.1.6"}


def test_project_lock_matches_this_environment() -> None:
    # The environment `make setup` builds is exactly the lock (plus torch, pinned outside it).
    root = Path(__file__).resolve().parents[2]
    with StageRun("s", params={}, root=root) as run:
        pass
    differences = run.record()["environment"]["lock"]["differences"]
    assert differences == [], f"installed packages differ from requirements.lock: {differences}"
