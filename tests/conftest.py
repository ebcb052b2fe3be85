"""Shared fixtures: tiny real MCAP files and export folders built file by file."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from _pytest.nodes import coerce_node_id  # pytest 9: an item's id (see pytest_collection_modifyitems)
from mcap.writer import CompressionType, Writer

from tests.leftovers import MARKER, describe, kill, session_processes, wait_until_gone

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_VARIABLE = "POLICYPIPE_SHARED"


def _shared_candidates() -> list[Path]:
    """Where the project's shared/ folder (design notes, public MCAP samples) may be: the variable's
    folder if set; else beside this checkout (CI, every workspace), or beside the repository it was
    cloned from (a clone elsewhere, in a temporary folder, of a local checkout)."""
    if SHARED_VARIABLE in os.environ:
        return [Path(os.environ[SHARED_VARIABLE])]
    candidates = [REPO_ROOT.parent / "shared"]
    origin = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if origin and Path(origin).is_dir():  # a local path, not a URL
        candidates.append(Path(origin).resolve().parent / "shared")
    return candidates


def mcap_samples() -> Path:
    """The shared public MCAP samples' folder; a test that needs them fails in one line if absent."""
    candidates = [c / "mcap-samples" for c in _shared_candidates()]
    for folder in candidates:
        if any(folder.rglob("*.mcap")):
            return folder
    pytest.fail(
        f"the shared MCAP samples are not in {' or '.join(map(str, candidates))}: set {SHARED_VARIABLE} to "
        "the folder that holds mcap-samples/",
        pytrace=False,
    )


# Under `make test` two test processes share the cores (pytest-xdist sets PYTEST_XDIST_WORKER).
# OpenMP and OpenBLAS threads wait for work by spinning: two processes of 2 threads each on 2
# cores made torch's small tests 6 to 40 times slower (the evaluation tests: 80 s, 13.6 s with one
# thread each). Each process, and what it starts, computes on one thread unless it sets its own
# (training pins train.cpu_threads, predict and the server theirs): set before torch or numpy loads.
if "PYTEST_XDIST_WORKER" in os.environ:
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")


# Session fixtures too costly to build in each test process: the tests that use one run in one
# process (`make test` distributes with --dist loadgroup), which builds it once. pipeline_repo is
# a whole `dvc repro`, about 40 s on a loaded 2-core machine.
SHARED_IN_ONE_PROCESS = ("pipeline_repo",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = process_group(item)
        if group is None:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False):  # in an xdist worker, with --dist loadgroup
            # The scheduler groups by the "@group" suffix of the ids the workers report. xdist 3.8
            # writes it to item._nodeid, which pytest 9.2 no longer reads (its ids are item._id):
            # the groups were silently lost, and each process built the fixtures. Written here.
            item._id = coerce_node_id(f"{item.nodeid}@{group}")


def process_group(item: pytest.Item) -> str | None:
    """The test process `item` must share with others (`--dist loadgroup`), if any: the session
    fixtures above by name; else its module's, where it uses a module-scoped fixture. Such a
    fixture is built once a module in each test process that runs one of its tests: a sampled,
    converted checkout or a Slurm training setup (10-30 s each) was built by both processes."""
    names = getattr(item, "fixturenames", ())
    for fixture in SHARED_IN_ONE_PROCESS:
        if fixture in names:
            return fixture
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(definitions[name][-1].scope == "module" for name in names if name in definitions):
        return item.nodeid.split("::")[0]
    return None


# Inherited by every process this session starts (tests/leftovers.py): a test's leftover is found
# by it, even reparented, and killed, and the test fails.
SESSION = uuid.uuid4().hex
os.environ[MARKER] = SESSION


def write_tiny_mcap(path: Path, messages: int = 3, tag: str = "") -> Path:
    """A small but real MCAP file (one JSON channel), written by the mcap library; `tag` goes
    into every message, so files with different tags have different bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        writer = Writer(f, compression=CompressionType.ZSTD)
        writer.start(profile="", library="policypipe-tests")
        schema = writer.register_schema("Tick", "jsonschema", b'{"type":"object"}')
        channel = writer.register_channel("/tick", "json", schema)
        for i in range(messages):
            t = 1_700_000_000_000_000_000 + i * 10_000_000
            writer.add_message(
                channel, log_time=t, publish_time=t, data=json.dumps({"i": i, "tag": tag}).encode()
            )
        writer.finish()
    return path


def write_status(path: Path, stem: str, **overrides) -> Path:
    status = {
        "source": f"{stem}.mcap",
        "output": f"{stem}_vio.mcap",
        "status": "success",
        "error": None,
        "task": "pick_place",
        "frames": 3,
    }
    status.update(overrides)
    path.write_text(json.dumps(status))
    return path


def write_triplet(folder: Path, stem: str, **status_overrides) -> list[Path]:
    """The three files of one good recording; its MCAPs are its own bytes (pair keeps one of
    several recordings whose `_vio.mcap` files are identical)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_tiny_mcap(folder / f"{stem}.mcap", tag=stem),
        write_tiny_mcap(folder / f"{stem}_vio.mcap", tag=stem),
        write_status(folder / f"{stem}_vio.json", stem, **status_overrides),
    ]


@pytest.fixture
def export(tmp_path: Path) -> Path:
    root = tmp_path / "export"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def pipeline_repo(tmp_path_factory) -> Path:
    """A copy of this checkout after a real `dvc repro` on 3 sample recordings (short training),
    its results committed as a user would. Shared by the end-to-end tests: treat as read-only,
    except for remotes, which each test names for itself."""
    from tests.workspace import checkout_copy, run, shorten_training

    repo = checkout_copy(tmp_path_factory.mktemp("checkout"))
    shorten_training(repo)
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "3", "--seed", "7")
    run(repo, "dvc", "add", "--quiet", "data/raw")
    (repo.parent / "code_commit").write_text(
        run(repo, "git", "rev-parse", "HEAD").strip()
    )  # what the runs recorded
    run(repo, "dvc", "repro")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "results of dvc repro")
    return repo


def require_installed(problem: str | None) -> None:
    """Skips the test when a server it needs (sshd, Slurm) is missing and cannot be installed;
    fails instead under CI, which runs as root and can install it: a skip there would hide tests."""
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real OpenSSH server on loopback (tests/sshd.py), for the remote tests."""
    from tests.sshd import ensure_sshd, start_sshd

    require_installed(ensure_sshd())
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def leaves_no_process_behind():
    """A test leaves no process behind: whatever it started and is still alive a few seconds after
    it ended (time for a cancelled Slurm job or a closed SSH session to go) is killed, and the test
    fails. Servers of session and module fixtures, started before, are left to their fixtures."""
    before = set(session_processes(SESSION))
    yield
    left = wait_until_gone(
        lambda: {pid: cmd for pid, cmd in session_processes(SESSION).items() if pid not in before}, 15
    )
    if left:
        kill(left)
        pytest.fail("the test left processes behind (now killed):\n" + describe(left), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def session_leaves_no_process_behind():
    """The fixtures' servers (sshd, Slurm, munge) stopped with their fixtures, and all they started."""
    yield
    left = wait_until_gone(lambda: session_processes(SESSION), 30)
    if left:
        kill(left)
        pytest.fail("the test session left processes behind (now killed):\n" + describe(left), pytrace=False)
