"""Walks back from a policy, a checkpoint or the dataset to the recordings that made it.

The chain is policy <- train run <- statistics <- stats run <- dataset fingerprint <- convert
run <- manifest <- pair run <- each recording's SHA-256. Every link is a hash match, never a
file name or a date: the
policy's export names the dataset fingerprint and statistics it was trained on; a stage's
provenance record (metrics/provenance/<stage>.json, git-tracked) names the hashes it read
and wrote. Records are looked up in the working tree first, then in the git history of the
record, so an artifact of an older commit still finds the run that made it. Everything read
is in git or in DVC's outputs: after a `git clone` and a `dvc pull` on another machine the
chain is the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policypipe.lineage.hashing import sha256_file, sha256_path
from policypipe.lineage.provenance import command_output

PROVENANCE_DIR = Path("metrics/provenance")
MANIFEST = Path("data/manifest.json")
# How far back the git history of a provenance record is searched.
HISTORY_COMMITS = 500


class LineageError(Exception):
    """The path is not something whose lineage is recorded."""


@dataclass
class Run:
    """One stage run, as its provenance record describes it, and where the record was found."""

    stage: str
    record: dict[str, Any]
    found_in: str  # "working tree" or "commit <sha>"

    def summary(self) -> dict[str, Any]:
        git, host, acc = (
            self.record.get("git", {}),
            self.record.get("host", {}),
            self.record.get("accelerator", {}),
        )
        gpus = acc.get("gpus") or []
        return {
            "stage": self.stage,
            "started_at": self.record.get("started_at"),
            "duration_s": self.record.get("duration_s"),
            "commit": git.get("commit"),
            "dirty": git.get("dirty"),
            # Records before dirty_files existed counted every changed file of the checkout.
            "changed_files": len(git.get("dirty_files", git.get("changed_files", []))),
            "host": host.get("hostname"),
            "device": acc.get("device"),
            "cpu": host.get("cpu_model"),  # absent from records before it was recorded
            "gpus": [g.get("name") for g in gpus],
            "torch": acc.get("torch"),
            "record": self.found_in,
        }


@dataclass
class Records:
    """Provenance records of a repository: the working tree's, then older versions from git."""

    root: Path
    _history: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)

    def _path(self, stage: str) -> Path:
        return PROVENANCE_DIR / f"{stage}.json"

    def _git(self, *args: str) -> str | None:
        return command_output(["git", *args], self.root)

    def _older(self, stage: str) -> list[tuple[str, dict[str, Any]]]:
        if stage not in self._history:
            path = self._path(stage).as_posix()
            commits = (self._git("log", f"-n{HISTORY_COMMITS}", "--format=%H", "--", path) or "").split()
            versions = []
            for commit in commits:
                text = self._git("show", f"{commit}:{path}")
                try:
                    record = json.loads(text) if text else None
                except json.JSONDecodeError:
                    record = None  # a damaged old record is no evidence: skip it
                if record is not None:
                    versions.append((commit, record))
            self._history[stage] = versions
        return self._history[stage]

    def find(self, stage: str, wrote: str | None = None, read: dict[str, str] | None = None) -> Run | None:
        """The newest run of `stage` that wrote the hash `wrote` and read every hash in `read`."""

        def matches(record: dict[str, Any]) -> bool:
            if wrote is not None and wrote not in record.get("outputs_sha256", {}).values():
                return False
            inputs = set(record.get("inputs_sha256", {}).values())
            return all(digest in inputs for digest in (read or {}).values())

        current = self.root / self._path(stage)
        if current.is_file():
            try:
                record = json.loads(current.read_text())
            except (OSError, json.JSONDecodeError):
                record = None
            if record is not None and matches(record):
                return Run(stage, record, "working tree")
        for commit, record in self._older(stage):
            if matches(record):
                return Run(stage, record, f"commit {commit}")
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LineageError(f"{path}: cannot be read ({exc})") from exc


def _identify(path: Path) -> str:
    if (path / "trainer.json").is_file():
        return "checkpoint"
    if (path / "manifest.json").is_file() and (path / "model.safetensors").is_file():
        return "policy"
    if (path / "zarr.json").is_file():
        return "dataset"
    if path.is_file() and path.suffix == ".json" and "recordings" in _read_json(path):
        return "manifest"
    raise LineageError(
        f"{path} is not a policy export, a checkpoint folder, a policypipe dataset or a manifest; "
        "try data/policy, data/train/checkpoints/latest or data/dataset.zarr"
    )


def trace(target: Path, root: Path) -> dict[str, Any]:
    """The chain from `target` back to the recordings, as plain data (see `format_trace`)."""
    target, root = Path(target), Path(root)
    if not target.exists():
        raise LineageError(f"{target} does not exist; if it is a pipeline output, `dvc pull` it first")
    records = Records(root)
    kind = _identify(target)
    chain: list[dict[str, Any]] = []
    if kind == "manifest":
        manifest_sha: str | None = sha256_file(target)
    else:
        if kind == "dataset":
            fingerprint = _dataset_fingerprint(target)
        else:
            fingerprint = _training_links(target, kind, records, chain)
        chain.append(
            {
                "what": "dataset",
                "fingerprint": fingerprint,
                **({"path": target.as_posix()} if kind == "dataset" else {}),
            }
        )
        manifest_sha = _convert_links(fingerprint, records, chain)
    if manifest_sha is not None:
        manifest = target if kind == "manifest" else root / MANIFEST
        _recording_links(manifest, target if kind == "manifest" else MANIFEST, manifest_sha, records, chain)
    return {"target": target.as_posix(), "kind": kind, "chain": chain}


def _dataset_fingerprint(store: Path) -> str:
    from policypipe.dataset.fingerprint import UnreadableArray, fingerprint

    try:
        return fingerprint(store).digest
    except UnreadableArray as exc:
        raise LineageError(
            f"{store}: {exc}; `policypipe verify {store}` says more, `dvc pull` restores it"
        ) from exc


def _training_links(target: Path, kind: str, records: Records, chain: list[dict[str, Any]]) -> str | None:
    """Policy or checkpoint <- train run <- statistics <- stats run; returns the dataset fingerprint."""
    if kind == "policy":
        meta = _read_json(target / "manifest.json").get("lineage", {})
        digest = sha256_path(target)
        chain.append(
            {"what": "policy", "path": target.as_posix(), "sha256": digest, "steps": meta.get("steps")}
        )
        run = records.find("train", wrote=digest)
        missing = (
            f"no train record wrote this policy (sha256 {digest}): it was made outside this repository's runs"
        )
    else:
        meta = _read_json(target / "trainer.json")
        chain.append({"what": "checkpoint", "path": target.as_posix(), "step": meta.get("step")})
        # A checkpoint is not a stage output: its run is the one that read the same inputs.
        run = records.find(
            "train", read={"dataset": meta.get("dataset_fingerprint"), "stats": meta.get("stats_sha256")}
        )
        missing = "no train record read this checkpoint's dataset and statistics"
    chain.append(_run_link("train", run, missing))
    stats_sha = meta.get("stats_sha256")
    chain.append({"what": "statistics", "sha256": stats_sha})
    chain.append(
        _run_link(
            "stats", records.find("stats", wrote=stats_sha), f"no stats record wrote statistics {stats_sha}"
        )
    )
    return meta.get("dataset_fingerprint")


def _convert_links(fingerprint: str | None, records: Records, chain: list[dict[str, Any]]) -> str | None:
    """Dataset <- convert run; returns the manifest's SHA-256 the run read."""
    run = records.find("convert", wrote=fingerprint) if fingerprint else None
    chain.append(_run_link("convert", run, f"no convert record wrote dataset fingerprint {fingerprint}"))
    if run is None:
        return None
    inputs = run.record.get("inputs_sha256", {})
    return next((digest for path, digest in inputs.items() if Path(path).name == MANIFEST.name), None)


def _recording_links(
    manifest: Path, shown_as: Path, manifest_sha: str, records: Records, chain: list[dict[str, Any]]
) -> None:
    """Manifest <- pair run <- every recording file's SHA-256 (from the manifest, if it is this one)."""
    chain.append({"what": "manifest", "path": shown_as.as_posix(), "sha256": manifest_sha})
    chain.append(
        _run_link(
            "pair", records.find("pair", wrote=manifest_sha), f"no pair record wrote manifest {manifest_sha}"
        )
    )
    have = sha256_file(manifest) if manifest.is_file() else None
    if have != manifest_sha:
        chain.append(
            {
                "what": "recordings",
                "missing": (
                    f"{shown_as} is {'absent' if have is None else 'another manifest'}: "
                    "check out the commit of the pair "
                    f"run above and `dvc pull {MANIFEST}` to list the recordings"
                ),
            }
        )
        return
    recordings = _read_json(manifest)["recordings"]
    chain.append(
        {
            "what": "recordings",
            "count": len(recordings),
            "recordings": [
                {
                    "stem": r["stem"],
                    "files": {
                        role: {"path": f["path"], "sha256": f["sha256"]}
                        for role, f in sorted(r["files"].items())
                    },
                }
                # An HDF5 demo: its group inside the file too.
                | ({"key": r["source"]["key"]} if "key" in r.get("source", {}) else {})
                for r in recordings
            ],
        }
    )


def _run_link(stage: str, run: Run | None, missing: str) -> dict[str, Any]:
    if run is None:
        return {"what": f"{stage} run", "missing": missing}
    return {"what": f"{stage} run", **run.summary()}


def _describe_run(link: dict[str, Any]) -> str:
    commit = (link.get("commit") or "?")[:12]
    dirty = f" +{link['changed_files']} uncommitted code/params" if link.get("dirty") else ""
    device = ", ".join(link["gpus"]) if link.get("gpus") else link.get("device") or "?"
    if device == "cpu" and link.get("cpu"):
        device = f"cpu: {link['cpu']}"  # 2-core machines differ about 3x in speed: which one
    where = "" if link.get("record") == "working tree" else f" [record from {link['record'][:19]}]"
    return f"{link['started_at']}  commit {commit}{dirty}  on {link.get('host')} ({device}){where}"


def format_trace(result: dict[str, Any]) -> str:
    lines = []
    for i, link in enumerate(result["chain"]):
        arrow = "" if i == 0 else "<- "
        what = link["what"]
        if "missing" in link:
            lines.append(f"{arrow}{what}: NOT FOUND: {link['missing']}")
        elif what == "policy":
            lines.append(f"policy {link['path']}  sha256 {link['sha256']}  ({link['steps']} training steps)")
        elif what == "checkpoint":
            lines.append(f"checkpoint {link['path']}  (step {link['step']})")
        elif what.endswith(" run"):
            lines.append(f"{arrow}{what}  {_describe_run(link)}")
        elif what == "statistics":
            lines.append(f"<- statistics sha256 {link['sha256']}")
        elif what == "dataset":
            path = f"{link['path']}  " if "path" in link else ""
            lines.append(f"{arrow}dataset {path}fingerprint {link['fingerprint']}")
        elif what == "manifest":
            lines.append(f"{arrow}manifest {link['path']}  sha256 {link['sha256']}")
        elif what == "recordings":
            lines.append(f"{arrow}{link['count']} recordings:")
            for rec in link["recordings"]:
                inside = f"  {rec['key']}" if "key" in rec else ""
                for f in rec["files"].values():
                    lines.append(f"   {f['sha256']}  {f['path']}{inside}")
    return "\n".join(lines)
