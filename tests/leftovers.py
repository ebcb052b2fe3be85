"""Processes a test leaves behind: every process the test session starts carries a marker in its
environment (conftest.py sets it before any test runs), so one that outlives its test is found in
/proc even after its parent died and it was reparented away from the test process."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

MARKER = "POLICYPIPE_TEST_SESSION"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent PID, process group) from /proc/PID/stat, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and brackets
    return fields[0], int(fields[1]), int(fields[2])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def session_processes(session: str) -> dict[int, str]:
    """Living processes (zombies left out) started by this test session: PID -> command line.
    Those with the marker, and every descendant of them or of this process: a forked child shows
    its parent's initial environment, and sshd starts a session with an environment of its own."""
    me = os.getpid()
    needle = f"{MARKER}={session}".encode()
    parents, marked = {}, {me}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX":
            continue
        parents[pid] = stat[1]
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                marked.add(pid)
        except OSError:
            continue  # ended meanwhile, or not ours to read
    found: set[int] = set()
    for pid in parents:
        chain, cursor = [], pid
        while cursor in parents and cursor not in marked and cursor not in found and len(chain) < 64:
            chain.append(cursor)
            cursor = parents[cursor]
        if cursor in marked or cursor in found:
            found.update(chain)
            if cursor != me:
                found.add(cursor)
    return {pid: _command(pid) for pid in sorted(found)}


def group_members(pgid: int) -> dict[int, str]:
    """Living processes in process group `pgid`: PID -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] not in "ZX" and stat[2] == pgid:
                found[int(entry.name)] = _command(int(entry.name))
    return found


def wait_until_gone(list_them, timeout_s: float) -> dict[int, str]:
    """Polls `list_them()` until it is empty or `timeout_s` passed; returns what is left."""
    deadline = time.monotonic() + timeout_s
    left = list_them()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = list_them()
    return left


def kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def describe(left: dict[int, str]) -> str:
    return "\n".join(f"  PID {pid}: {command[:300]}" for pid, command in sorted(left.items()))
