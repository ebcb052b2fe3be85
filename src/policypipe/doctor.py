"""`policypipe doctor`: what to know about a machine before committing it to a run.

Each check is small, reads only, and says what to do: GPUs and their free memory, this user's
processes still holding GPU memory (listed, never killed), free disk against what the run will
write, the lock against what is installed, the DVC remote and its settings (no secret in the
git-tracked `.dvc/config`; a `.dvc/config.local` that keeps older revisions loadable), and Slurm
when params ask for it. No check prints a secret: URLs are shown with their password masked.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str

    def line(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.message}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _nvidia_smi(query: str, fields: str) -> list[list[str]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def check_gpus() -> Check:
    rows = _nvidia_smi("gpu", "index,name,memory.total,memory.free")
    if rows is None:
        return Check(
            "gpus", "warn", "no NVIDIA GPU visible (no nvidia-smi, or it failed): training runs on the CPU"
        )
    if not rows:
        return Check("gpus", "warn", "nvidia-smi lists no GPU: training runs on the CPU")
    parts = [
        f"{i}: {name}, {int(free) / 1024:.1f} of {int(total) / 1024:.1f} GiB free"
        for i, name, total, free in rows
    ]
    return Check("gpus", "ok", "; ".join(parts))


def _process_owner(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def check_gpu_processes() -> Check:
    """This user's processes holding GPU memory: often a run that did not end (a closed tmux
    pane, a crashed launcher's children). Listed with PID and command; killing is the user's call."""
    rows = _nvidia_smi("compute-apps", "pid,used_memory")
    if rows is None:
        return Check("gpu processes", "ok", "no NVIDIA GPU to hold memory")
    mine = [
        (int(pid), used) for pid, used in rows if pid.isdigit() and _process_owner(int(pid)) == os.getuid()
    ]
    if not mine:
        return Check("gpu processes", "ok", "none of yours holds GPU memory")
    listed = "; ".join(f"PID {pid} ({used} MiB): {_command_line(pid)}" for pid, used in mine)
    return Check(
        "gpu processes",
        "warn",
        f"{len(mine)} of your processes hold GPU memory (end them yourself if they are left over): {listed}",
    )


def check_disk(repo: Path, needed: dict[str, int]) -> Check:
    """Free space where data/ lives against the bytes the run will write (`needed`, by what)."""
    data = repo / "data"
    free = shutil.disk_usage(data if data.exists() else repo).free
    total = sum(needed.values())
    detail = ", ".join(f"{what} {_gib(n)}" for what, n in needed.items())
    if free < total:
        return Check(
            "disk",
            "fail",
            f"{_gib(free)} free under {data}, the run needs about {_gib(total)} ({detail}): "
            "free space or move data/ to a larger disk",
        )
    return Check(
        "disk", "ok", f"{_gib(free)} free under {data}; the run needs about {_gib(total)} ({detail})"
    )


_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)")


def check_lock(lock: Path) -> Check:
    """Every pin of the lock against what is installed (names compared as pip normalises them)."""
    if not lock.is_file():
        return Check("environment", "fail", f"{lock} not found: run from the repository root")
    wrong = []
    for line in lock.read_text().splitlines():
        match = _PIN.match(line.strip())
        if not match:
            continue
        name, pinned = match.groups()
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name} missing (lock: {pinned})")
            continue
        if installed != pinned:
            wrong.append(f"{name} {installed} (lock: {pinned})")
    if wrong:
        return Check(
            "environment",
            "fail",
            f"{len(wrong)} package(s) differ from {lock.name}: {'; '.join(wrong[:8])}"
            f"{' ...' if len(wrong) > 8 else ''}. Run `make setup`",
        )
    return Check("environment", "ok", f"installed packages match {lock.name}")


def check_remote(repo: Path, known_hosts: Path) -> Check:
    from policypipe.remote import RemoteError, check_host_key, mask_url, parse_ssh_url, remote_settings

    try:
        name, settings = remote_settings(repo, None)
    except RemoteError as exc:
        return Check("remote", "warn", str(exc))
    url = settings["url"]
    if url.startswith("ssh://"):
        try:
            target = parse_ssh_url(url)
            result = check_host_key(target.host, int(settings.get("port") or target.port), known_hosts)
        except (RemoteError, OSError) as exc:
            return Check("remote", "fail", f"{name} ({mask_url(url)}): {exc}")
        return Check("remote", "ok" if result.ok else "fail", f"{name}: {result.message(known_hosts)}")
    if "://" in url:
        return Check("remote", "warn", f"{name} is {mask_url(url)}: only SSH and folder remotes are checked")
    folder = Path(url) if Path(url).is_absolute() else (repo / ".dvc" / url).resolve()
    probe = folder if folder.exists() else folder.parent
    if os.access(probe, os.W_OK):
        return Check("remote", "ok", f"{name}: folder {folder} is writable")
    return Check(
        "remote", "fail", f"{name}: folder {folder} cannot be written: create it or fix its permissions"
    )


def check_remote_config(repo: Path) -> list[Check]:
    """Every remote's settings, not only the default one's: one warning per problem found."""
    from policypipe.remote import config_problems

    problems = config_problems(repo)
    if not problems:
        return [
            Check(
                "remote config",
                "ok",
                "no secret in .dvc/config; .dvc/config.local keeps older revisions loadable",
            )
        ]
    return [Check("remote config", "warn", problem) for problem in problems]


def check_slurm() -> Check:
    from policypipe.cluster.submit import SlurmError, check_reachable

    try:
        return Check("slurm", "ok", check_reachable())
    except SlurmError as exc:
        return Check("slurm", "fail", str(exc))


def checkpoint_bytes(train_config: Any) -> int:
    """One checkpoint's size: weights, their EMA and Adam's two moments, in float32."""
    from policypipe.policy.diffusion import DiffusionPolicy

    parameters = sum(p.numel() for p in DiffusionPolicy(train_config.model).parameters())
    return parameters * 4 * 4


def run_checks(checks: list[Callable[[], Check | list[Check]]]) -> list[Check]:
    """Each check's result (a check may find several problems: a list), in order."""
    results = []
    for check in checks:
        try:
            result = check()
            results.extend(result if isinstance(result, list) else [result])
        except Exception as exc:  # noqa: BLE001 - a check that breaks is reported, the others still run
            results.append(
                Check(getattr(check, "__name__", "check"), "fail", f"the check itself failed: {exc!r}")
            )
    return results
