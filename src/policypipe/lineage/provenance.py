"""The provenance record every stage writes next to its outputs.

It answers, months later, "what exactly produced this?": code (git commit, whether the
stage's own code and params differ from it, and a hash of that diff), environment (the lock's
hash, what is installed, and every
difference between the two), hardware (GPUs and driver, or "cpu"), host, the exact command
and params, and the hashes of what the stage read and wrote. It is host- and time-dependent
by nature, so it lives in its own small git-tracked file, never inside a hashed data output.

Usage, in a stage script:

    with StageRun("pair", params=asdict(config), root=repo_root) as run:
        ...do the work...
        run.inputs["data/raw"] = export_digest
        run.add_outputs(["data/manifest.json"])
    run.write(Path("metrics/provenance/pair.json"))
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from policypipe.atomic import write_json_atomic
from policypipe.lineage.hashing import sha256_file, sha256_path

log = logging.getLogger(__name__)

PROVENANCE_VERSION = 1
LOCK_FILE = "requirements.lock"
# torch is deliberately not in the lock (one lock for CPU and CUDA machines); this is its pin.
PINNED_OUTSIDE_LOCK = {"torch": "2.13.0"}
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def command_output(args: list[str], cwd: Path) -> str | None:
    """A command's stdout, or None if it cannot run or fails (git outside a checkout, no nvidia-smi)."""
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace")


def stage_definition(root: Path, stage: str) -> tuple[list[str], list[str]] | None:
    """(the deps, the params sections) `dvc.yaml` declares for `stage`, or None if it declares none.

    These are what decide the stage's output, so they are what "dirty" is about; an output of
    another stage among them is the pipeline's product, not code (`check_export`'s record is
    git-tracked and rewritten by every run), and is left out.
    """
    dvc_yaml = root / "dvc.yaml"
    if not dvc_yaml.is_file():
        return None
    from ruamel.yaml import YAML

    stages = (YAML(typ="safe", pure=True).load(dvc_yaml.read_text()) or {}).get("stages", {})
    if stage not in stages:
        return None

    def paths(entries: list) -> list[str]:
        return [e if isinstance(e, str) else next(iter(e)) for e in entries]

    made = {
        out for other in stages.values() for out in paths(other.get("outs", []) + other.get("metrics", []))
    }
    deps = [d for d in paths(stages[stage].get("deps", [])) if d not in made]
    sections: list[str] = []
    for entry in stages[stage].get("params", []):
        if isinstance(entry, str):
            sections.append(entry)
        else:  # {params file: [keys]}; only params.yaml sections are tracked here
            sections.extend(entry.get("params.yaml") or [])
    return deps, sections


def _yaml_now_and_committed(root: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A YAML file of the checkout as it is and as committed at HEAD ({} where there is none)."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)  # YAML 1.2, as DVC reads dvc.yaml and params.yaml
    path = root / name
    now = (yaml.load(path.read_text()) if path.is_file() else None) or {}
    committed_text = command_output(["git", "show", f"HEAD:{name}"], root)
    committed = (yaml.load(committed_text) if committed_text else None) or {}
    return now, committed


def _stage_definition_changed(root: Path, stage: str) -> list[str]:
    """["dvc.yaml [stage]"] when the stage's entry (its command, deps, params) differs from the commit's."""
    now, committed = _yaml_now_and_committed(root, "dvc.yaml")
    same = now.get("stages", {}).get(stage) == committed.get("stages", {}).get(stage)
    return [] if same else [f"dvc.yaml [{stage}]"]


def _params_sections_changed(root: Path, sections: list[str]) -> list[str]:
    """The params.yaml sections that differ from the committed params.yaml."""
    now, committed = _yaml_now_and_committed(root, "params.yaml")
    return [f"params.yaml [{s}]" for s in sections if now.get(s) != committed.get(s)]


def _status_paths(root: Path, paths: list[str] | None) -> list[str]:
    args = ["git", "status", "--porcelain=v1", "--untracked-files=all", "--no-renames"]
    if paths is not None:
        args += ["--", *paths]
    status = command_output(args, root) or ""
    return sorted(line[3:] for line in status.splitlines() if line.strip())


def git_state(root: Path, stage: str | None = None) -> dict[str, Any]:
    """The commit, and whether what decides the stage's output differs from it.

    `dirty` is about the stage's own code and params (its `dvc.yaml` deps and params
    sections), not the whole checkout: under `dvc repro` the checkout is never clean (DVC
    removes a stage's git-tracked outputs before running it, and earlier stages have just
    rewritten theirs). `changed_files` still lists every difference, for information.
    Without a `dvc.yaml` entry for the stage, every difference counts.
    """
    commit = command_output(["git", "rev-parse", "HEAD"], root)
    if commit is None:
        return {"available": False, "reason": f"{root} is not a git checkout with a commit"}
    changed = _status_paths(root, None)
    definition = stage_definition(root, stage) if stage else None
    if definition is None:
        decisive, dirty_files = None, changed
    else:
        decisive, sections = definition
        dirty_files = (
            _status_paths(root, decisive)
            + _params_sections_changed(root, sections)
            + _stage_definition_changed(root, stage)
        )
    diff = (command_output(["git", "diff", "HEAD", "--binary", "--", *(decisive or [])], root) or "").encode()
    # `git diff` leaves out files git does not track yet: their content counts too.
    untracked = command_output(
        ["git", "ls-files", "--others", "--exclude-standard", "-z", "--", *(decisive or [])], root
    )
    for rel in sorted(filter(None, (untracked or "").split("\0"))):
        if (root / rel).is_file():
            diff += b"\0untracked " + rel.encode() + b"\0" + (root / rel).read_bytes()
    return {
        "available": True,
        "commit": commit.strip(),
        "branch": (command_output(["git", "rev-parse", "--abbrev-ref", "HEAD"], root) or "").strip(),
        "dirty": bool(dirty_files),
        "dirty_files": dirty_files,
        "changed_files": changed,
        # Over the same tracked paths as `dirty`: with the commit, it names the exact code.
        "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None,
    }


def read_lock(lock_path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lock_path.read_text().splitlines():
        if m := _REQUIREMENT.match(line.strip()):
            pins[_normalize(m[1])] = m[2]
    return pins


def installed_packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[_normalize(name)] = dist.version
    return dict(sorted(found.items()))


def environment_state(root: Path) -> dict[str, Any]:
    installed = installed_packages()
    lock_path = root / LOCK_FILE
    state: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "installed": installed,
    }
    if not lock_path.is_file():
        state["lock"] = None
        return state
    expected = read_lock(lock_path) | PINNED_OUTSIDE_LOCK
    differences = []
    for name, want in sorted(expected.items()):
        have = installed.get(name)
        # Local version labels (torch 2.13.0+cpu) are builds of the pinned release.
        if have is None:
            differences.append({"package": name, "lock": want, "installed": None})
        elif have.split("+")[0] != want:
            differences.append({"package": name, "lock": want, "installed": have})
    own = {"policypipe", "pip", "setuptools", "wheel"}
    for name, have in installed.items():
        if name not in expected and name not in own:
            differences.append({"package": name, "lock": None, "installed": have})
    state["lock"] = {"path": LOCK_FILE, "sha256": sha256_file(lock_path), "differences": differences}
    return state


def accelerator_state() -> dict[str, Any]:
    """The accelerator a stage ran on. torch's version comes from its package metadata: importing
    torch only to record it would add ~200 MB to every stage that never uses it (pair, convert,
    stats). CUDA and cuDNN are what torch reports, so they are recorded by the stages that load it
    (train, eval); a stage without torch computed on the CPU."""
    state: dict[str, Any] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        state["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        state["torch"] = None
    torch = sys.modules.get("torch")
    state["torch_loaded"] = torch is not None
    if torch is not None:
        state["cuda"] = torch.version.cuda
        state["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cuda_ok = torch.cuda.is_available()
    else:
        state["cuda"] = state["cudnn"] = None
        cuda_ok = False
    state["gpus"] = _nvidia_smi()
    state["device"] = "cuda" if cuda_ok else "cpu"
    return state


def _nvidia_smi() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    fields = ["index", "name", "memory.total", "driver_version", "uuid"]
    out = command_output(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"], Path.cwd()
    )
    if not out:
        return []
    return [
        dict(zip(fields, (v.strip() for v in line.split(",")))) for line in out.splitlines() if line.strip()
    ]


def cpu_model() -> str | None:
    """The processor's name, e.g. "Intel(R) Xeon(R) Processor" or "AMD EPYC 7B13": machines with the
    same core count differ about 3x in training speed, and float results differ between CPU
    families (their vector units round differently), so a run's speed and bytes are read with it.
    Linux names it in /proc/cpuinfo ("model name" on x86, "Hardware" or nothing on some ARM
    boards), macOS through sysctl; platform.processor() is the last resort (often only "x86_64")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        name = command_output(["sysctl", "-n", "machdep.cpu.brand_string"], Path.cwd())
        if name:
            return name.strip()
    return platform.processor() or None


def host_state() -> dict[str, Any]:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
    }


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class StageRun:
    """Collects one stage run's provenance; a context manager that times the run."""

    stage: str
    params: dict[str, Any]
    root: Path = field(default_factory=Path.cwd)
    command: str = field(default_factory=lambda: shlex.join([Path(sys.executable).name, *sys.argv]))
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    # Stage-specific facts worth keeping with the run (e.g. what identifies convert's converter).
    details: dict[str, Any] = field(default_factory=dict)
    _started: str | None = None
    _ended: str | None = None
    _t0: float = 0.0
    _duration: float | None = None
    _git: dict[str, Any] | None = None

    def __enter__(self) -> StageRun:
        self._started, self._t0 = _now(), time.monotonic()
        # Taken before the stage writes anything: the code and params it is about to run with.
        self._git = git_state(self.root, self.stage)
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended, self._duration = _now(), round(time.monotonic() - self._t0, 3)

    def add_inputs(self, paths: list[str | Path]) -> None:
        for p in paths:
            self.inputs[Path(p).as_posix()] = sha256_path(self.root / p)

    def add_outputs(self, paths: list[str | Path]) -> None:
        for p in paths:
            self.outputs[Path(p).as_posix()] = sha256_path(self.root / p)

    def record(self) -> dict[str, Any]:
        return {
            "format_version": PROVENANCE_VERSION,
            "stage": self.stage,
            "command": self.command,
            "cwd": str(Path.cwd()),
            "params": self.params,
            "inputs_sha256": dict(sorted(self.inputs.items())),
            "outputs_sha256": dict(sorted(self.outputs.items())),
            "details": self.details,
            "started_at": self._started,
            "ended_at": self._ended,
            "duration_s": self._duration,
            "git": self._git if self._git is not None else git_state(self.root, self.stage),
            "environment": environment_state(self.root),
            "accelerator": accelerator_state(),
            "host": host_state(),
        }

    def write(self, path: Path) -> dict[str, Any]:
        record = self.record()
        write_json_atomic(path, record)
        log.info("provenance of %s written to %s", self.stage, path)
        return record
