from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policypipe.lineage.hashing import sha256_file
from policypipe.lineage.provenance import StageRun, cpu_model, read_lock

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(root: Path, *args: str) -> str:
    import os

    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True, env=os.environ | GIT_ENV
    ).stdout


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
    assert host["cpu_model"] == cpu_model() and host["cpu_model"]


def test_cpu_model_is_the_processors_name(monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/proc/cpuinfo").exists():
        names = [
            line.partition(":")[2].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.partition(":")[0].strip() in ("model name", "Hardware")
        ]
        if names:
            assert cpu_model() == names[0]

    # Where /proc/cpuinfo cannot be read (macOS, a sandbox), another source names it or None does.
    def no_cpuinfo(*args: object, **kwargs: object) -> None:
        raise OSError("no /proc/cpuinfo")

    monkeypatch.setattr("builtins.open", no_cpuinfo)
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr(sys, "platform", "linux")
    assert cpu_model() is None


RECORD_IN_FRESH_PROCESS = """
import json, sys
from pathlib import Path
from policypipe.lineage.provenance import StageRun
with StageRun("convert", params={}, root=Path(sys.argv[1])) as run:
    pass
record = run.record()
print(json.dumps({"torch_imported": "torch" in sys.modules, "accelerator": record["accelerator"]}))
"""


def test_a_stage_without_torch_records_its_version_without_importing_it(tmp_path: Path) -> None:
    # Importing torch to read its version cost the convert stage ~200 MB of resident memory.
    root = tmp_path / "repo"
    make_repo(root, "")
    out = subprocess.run(
        [sys.executable, "-c", RECORD_IN_FRESH_PROCESS, str(root)], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["torch_imported"] is False
    acc = seen["accelerator"]
    assert acc["torch"].startswith("2.13.0") and acc["torch_loaded"] is False
    assert acc["device"] == "cpu" and acc["cuda"] is None


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


def git_of_stage_s(root: Path) -> dict:
    """The git part of the record of a run of stage `s`, started and ended now."""
    with StageRun("s", params={}, root=root) as run:
        pass
    return run.record()["git"]


def test_dirty_is_about_the_stages_own_code_and_params_not_the_whole_checkout(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_repo(root, "")
    (root / "code.py").write_text("print('v1')\n")
    (root / "other.py").write_text("print('unrelated')\n")
    (root / "out.json").write_text("{}")
    (root / "params.yaml").write_text("s:\n  lr: 1\nother:\n  x: 1\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python code.py\n    deps: [code.py, data/raw]\n    params: [s]\n"
        "    outs: [{out.json: {cache: false}}]\n"
    )
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "stage s")

    # What dvc repro leaves: the stage's output removed, another file and params section edited.
    (root / "out.json").unlink()
    (root / "other.py").write_text("print('edited')\n")
    (root / "params.yaml").write_text("s:\n  lr: 1\nother:\n  x: 2\n")
    clean = git_of_stage_s(root)
    assert clean["dirty"] is False and clean["dirty_files"] == [] and clean["diff_sha256"] is None
    assert {"out.json", "other.py", "params.yaml"} <= set(clean["changed_files"])

    (root / "code.py").write_text("print('v2')\n")
    edited = git_of_stage_s(root)
    assert (
        edited["dirty"] is True and edited["dirty_files"] == ["code.py"] and len(edited["diff_sha256"]) == 64
    )

    (root / "code.py").write_text("print('v1')\n")
    (root / "params.yaml").write_text("s:\n  lr: 2\nother:\n  x: 2\n")
    assert git_of_stage_s(root)["dirty_files"] == ["params.yaml [s]"]


def test_git_state_is_taken_when_the_stage_starts(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_repo(root, "")
    with StageRun("s", params={}, root=root) as run:
        (root / "in.txt").write_text("written by the stage itself")
    assert run.record()["git"]["dirty"] is False


def test_an_untracked_dep_and_a_changed_stage_command_are_dirty_and_hashed(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_repo(root, "")
    (root / "dvc.yaml").write_text("stages:\n  s:\n    cmd: python code.py\n    deps: [code.py, helper.py]\n")
    (root / "code.py").write_text("import helper\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "stage s")

    (root / "helper.py").write_text("X = 1\n")  # written, not yet added to git
    first = git_of_stage_s(root)
    assert first["dirty_files"] == ["helper.py"] and first["diff_sha256"] is not None
    (root / "helper.py").write_text("X = 2\n")
    assert git_of_stage_s(root)["diff_sha256"] != first["diff_sha256"]

    (root / "helper.py").unlink()
    (root / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python code.py --fast\n    deps: [code.py, helper.py]\n"
    )
    assert git_of_stage_s(root)["dirty_files"] == ["dvc.yaml [s]"]


def test_an_upstream_stages_git_tracked_output_is_no_dirty_code(tmp_path: Path) -> None:
    # check_export's record is git-tracked (cache: false) and rewritten on every repro; pair
    # depends on it. It is the pipeline's product, not the stage's code.
    root = tmp_path / "repo"
    make_repo(root, "")
    (root / "dvc.yaml").write_text(
        "stages:\n  check:\n    cmd: python check.py\n    outs: [{checked.json: {cache: false}}]\n"
        "  s:\n    cmd: python code.py\n    deps: [checked.json, code.py]\n"
    )
    (root / "code.py").write_text("print('v1')\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "stages")
    (root / "checked.json").write_text('{"files": 3}')  # written by the upstream stage
    state = git_of_stage_s(root)
    assert state["dirty"] is False and state["dirty_files"] == [] and "checked.json" in state["changed_files"]
    (root / "code.py").write_text("print('v2')\n")
    assert git_of_stage_s(root)["dirty_files"] == ["code.py"]
