"""The `pair` step: exact pairing of `S.mcap` / `S_vio.mcap` / `S_vio.json` by stem.

Every file under the export folder ends up either in an accepted recording of the manifest
or in the report with one reason. Nothing is matched by a fuzzy glob, nothing is dropped
silently, and the manifest holds only export-relative paths so it is the same on a laptop
and on a server.

With `pair.source` robomimic or aloha the folder holds HDF5 files instead, and this is their
inventory: each robomimic demo, or each ALOHA file, a recording (`recordings.hdf5`,
`recordings.aloha`), with the same report of what cannot be read.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import stat
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from policypipe.lineage.hashing import sha256_files, tree_digest
from policypipe.recordings.aloha import AlohaConfig, aloha_inventory
from policypipe.recordings.hdf5 import SUFFIXES as HDF5_SUFFIXES
from policypipe.recordings.hdf5 import Hdf5Rejected, RobomimicConfig, robomimic_inventory
from policypipe.recordings.layout import (
    MAX_STATUS_BYTES,
    MCAP_ROLES,
    STATUS_FIELDS,
    STATUS_REQUIRED_KEYS,
    STATUS_SUCCESS,
    McapState,
    Role,
    classify,
    describe_non_input,
    file_names,
    mcap_state,
)

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class PairConfig:
    """`pair` section of params.yaml."""

    # When set, a status json whose `task` differs is rejected (absent `task` is accepted).
    task: str | None = None
    # A `_vio.mcap` without footer is rejected unless this is true; then it is accepted with
    # `truncated: true` and `convert` salvages what is readable before the damage.
    accept_truncated: bool = False
    # Files hashed concurrently; 0 means a sensible default for the machine.
    hash_workers: int = 0
    # mcap: the studio's export (S.mcap, S_vio.mcap, S_vio.json); robomimic: robomimic / MimicGen
    # HDF5 files, each demo a recording, read as `robomimic` says; aloha: ALOHA / RDT HDF5 files,
    # one episode each, in joint space, read as `aloha` says (docs/interop.md, "Import").
    source: Literal["mcap", "robomimic", "aloha"] = "mcap"
    robomimic: RobomimicConfig = field(default_factory=RobomimicConfig)
    aloha: AlohaConfig = field(default_factory=AlohaConfig)

    def __post_init__(self) -> None:
        if self.task is not None and not self.task.strip():
            raise ValueError("task must be a non-empty name, or null to accept every task")
        if self.hash_workers < 0:
            raise ValueError(f"hash_workers must be >= 0 (0 = automatic), got {self.hash_workers}")
        if self.source == "aloha":
            self.aloha.required_rate()  # refused before any file is read


class Reason(str, enum.Enum):
    NOT_AN_INPUT = "not_an_input"
    NOT_PAIRED = "not_paired"
    EMPTY = "empty"
    INVALID_JSON = "invalid_json"
    TOO_LARGE = "too_large"
    MISSING_KEYS = "missing_keys"
    STATUS_NOT_SUCCESS = "status_not_success"
    SOURCE_NOT_IN_FOLDER = "source_not_in_folder"
    NAME_MISMATCH = "name_mismatch"
    OTHER_TASK = "other_task"
    NOT_MCAP = "not_mcap"
    TRUNCATED = "truncated"
    DUPLICATE_STEM = "duplicate_stem"
    DUPLICATE_RECORDING = "duplicate_recording"
    SYMLINK_OUTSIDE_EXPORT = "symlink_outside_export"
    SYMLINK_NOT_FOLLOWED = "symlink_not_followed"
    SYMLINK_LOOP = "symlink_loop"
    NAME_NOT_UTF8 = "name_not_utf8"
    UNREADABLE = "unreadable"
    # An HDF5 source (pair.source: robomimic or aloha), `recordings.hdf5` and `recordings.aloha`:
    NOT_HDF5 = "not_hdf5"
    NOT_ROBOMIMIC = "not_robomimic"
    NO_FILTER = "no_filter"
    NO_DEMOS = "no_demos"
    NO_CONTROL_RATE = "no_control_rate"


@dataclass(frozen=True)
class Rejection:
    path: str  # export-relative POSIX path
    reason: Reason
    detail: str


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Recording:
    stem: str
    folder: str
    files: dict[Role, FileEntry]
    status: dict[str, Any]
    truncated: bool
    # An HDF5 demo or episode: how to read it, and where it is in its file (`DemoSource.to_json`,
    # `aloha.EpisodeSource.to_json`).
    source: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        entry = {
            "stem": self.stem,
            "folder": self.folder,
            "truncated": self.truncated,
            "files": {role.value: vars(entry) for role, entry in self.files.items()},
            "status": self.status,
        }
        return entry | ({"source": self.source} if self.source is not None else {})


@dataclass(frozen=True)
class PairingResult:
    recordings: tuple[Recording, ...]
    rejections: tuple[Rejection, ...]
    # Tree digest over every regular file of the export: the input hash for provenance.
    export_sha256: str
    config: PairConfig
    files_seen: int = field(default=0)

    def manifest(self) -> dict[str, Any]:
        head = {"format_version": MANIFEST_VERSION}
        if self.config.source == "mcap":
            head |= {"task": self.config.task, "accept_truncated": self.config.accept_truncated}
        else:
            head |= {"source": self.config.source}
        return head | {"recordings": [r.to_json() for r in self.recordings]}

    def report(self) -> dict[str, Any]:
        return {
            "accepted": [r.stem for r in self.recordings],
            "rejected_files": [
                {"path": r.path, "reason": r.reason.value, "detail": r.detail} for r in self.rejections
            ],
        }

    def metrics(self) -> dict[str, Any]:
        # An HDF5 demo's rejection is "file#key": one demo of a file whose other demos may pair.
        files = [r for r in self.rejections if "#" not in r.path]
        by_reason = Counter(r.reason.value for r in files)
        rejected_stems = {(PurePosixPath(r.path).parent, _stem_of(r.path)) for r in files}
        metrics = {
            "recordings_accepted": len(self.recordings),
            "recordings_truncated_accepted": sum(r.truncated for r in self.recordings),
            "recording_stems_rejected": len({s for s in rejected_stems if s[1] is not None}),
            "files_seen": self.files_seen,
            "files_rejected": len(files),
            "files_rejected_by_reason": dict(sorted(by_reason.items())),
        }
        if self.config.source == "robomimic":  # one file, many demos
            demos = Counter(r.reason.value for r in self.rejections if "#" in r.path)
            metrics |= {
                "demos_rejected": sum(demos.values()),
                "demos_rejected_by_reason": dict(sorted(demos.items())),
            }
        return metrics


def _stem_of(path: str) -> str | None:
    found = classify(PurePosixPath(path).name)
    return found[1] if found else None


def pair_export(export_root: Path, config: PairConfig) -> PairingResult:
    """Pairs every recording of an export folder, or takes the inventory of its HDF5 files (see
    the module docstring)."""
    root = Path(export_root)
    if not root.is_dir():
        raise FileNotFoundError(f"export folder {root} does not exist or is not a folder")
    root = root.resolve()

    rejections: list[Rejection] = []
    candidates: list[Path] = []  # regular files (or links to files inside the export)
    for path, reason, detail in walk_export(root):
        if reason is None:
            candidates.append(path)
        else:
            rejections.append(Rejection(export_relative_path(path, root), reason, detail))

    readable: list[Path] = []
    for path in candidates:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                # A named pipe would block the first read forever; a device is no recording.
                rejections.append(
                    Rejection(
                        export_relative_path(path, root),
                        Reason.UNREADABLE,
                        "not a regular file (a pipe, socket or device)",
                    )
                )
                continue
            with open(path, "rb"):
                readable.append(path)
        except OSError as exc:
            rejections.append(
                Rejection(
                    export_relative_path(path, root), Reason.UNREADABLE, f"cannot be read: {exc.strerror}"
                )
            )
    workers = config.hash_workers or None
    digests = sha256_files(readable, workers=workers)
    export_sha256 = tree_digest({export_relative_path(p, root): d for p, d in digests.items()})

    pair = _pair_mcap if config.source == "mcap" else _inventory_hdf5
    recordings = pair(root, readable, digests, config, rejections)
    rejections.sort(key=lambda r: r.path)
    log.info("paired %d recordings, rejected %d files", len(recordings), len(rejections))
    return PairingResult(
        recordings=tuple(recordings),
        rejections=tuple(rejections),
        export_sha256=export_sha256,
        config=config,
        files_seen=len(candidates) + sum(1 for r in rejections if r.reason in _WALK_REASONS),
    )


def _pair_mcap(
    root: Path,
    readable: list[Path],
    digests: dict[Path, str],
    config: PairConfig,
    rejections: list[Rejection],
) -> list[Recording]:
    """The studio's recordings: S.mcap, S_vio.mcap and S_vio.json by stem."""
    # stem -> folder -> role -> path
    by_stem: dict[str, dict[str, dict[Role, Path]]] = defaultdict(lambda: defaultdict(dict))
    for path in readable:
        found = classify(path.name)
        if found is None:
            rejections.append(
                Rejection(
                    export_relative_path(path, root), Reason.NOT_AN_INPUT, describe_non_input(path.name)
                )
            )
            continue
        role, stem = found
        by_stem[stem][export_relative_path(path.parent, root)][role] = path

    recordings: list[Recording] = []
    for stem in sorted(by_stem):
        folders = by_stem[stem]
        if len(folders) > 1:
            where = " and ".join(f"{f}/" for f in sorted(folders))
            detail = (
                f"stem {stem!r} appears in {where}: "
                "stems must be unique across the export; rename or remove one"
            )
            for files in folders.values():
                rejections.extend(
                    Rejection(export_relative_path(p, root), Reason.DUPLICATE_STEM, detail)
                    for p in files.values()
                )
            continue
        ((folder, files),) = folders.items()
        outcome = _check_recording(root, stem, files, config)
        if isinstance(outcome, _Rejected):
            rejections.extend(
                Rejection(export_relative_path(p, root), outcome.reason, outcome.detail)
                for p in files.values()
            )
            continue
        entries = {
            role: FileEntry(
                export_relative_path(files[role], root), files[role].stat().st_size, digests[files[role]]
            )
            for role in MCAP_ROLES
        }
        recordings.append(Recording(stem, folder, entries, outcome.status, outcome.truncated))
    recordings, copies = _without_copies(recordings)
    rejections.extend(copies)
    return recordings


def _inventory_hdf5(
    root: Path,
    readable: list[Path],
    digests: dict[Path, str],
    config: PairConfig,
    rejections: list[Rejection],
) -> list[Recording]:
    """Every demo of every robomimic file, a recording each (stem `<file stem>.demo_N`), or every
    ALOHA file, one recording (its stem); a file or demo that cannot be read is in the report with
    its reason, the rest are kept."""
    by_stem: dict[str, list[Recording]] = defaultdict(list)
    for path in readable:
        where = export_relative_path(path, root)
        if path.suffix.lower() not in HDF5_SUFFIXES:
            detail = (
                f"not an HDF5 file (pair.source is {config.source}: inputs are {' or '.join(HDF5_SUFFIXES)})"
            )
            rejections.append(Rejection(where, Reason.NOT_AN_INPUT, detail))
            continue
        entry = FileEntry(where, path.stat().st_size, digests[path])
        folder = export_relative_path(path.parent, root)
        try:
            if config.source == "aloha":
                frames, episode = aloha_inventory(path, config.aloha)
                status = {"frames": frames}
                by_stem[path.stem].append(
                    Recording(path.stem, folder, {Role.HDF5: entry}, status, False, episode.to_json())
                )
                continue
            demos, bad = robomimic_inventory(path, config.robomimic)
        except Hdf5Rejected as exc:
            rejections.append(Rejection(where, Reason(exc.reason), exc.detail))
            continue
        rejections.extend(Rejection(f"{where}#{key}", Reason(reason), detail) for key, reason, detail in bad)
        for demo in demos:
            stem = f"{path.stem}.{demo.key.rpartition('/')[2]}"
            by_stem[stem].append(
                Recording(
                    stem, folder, {Role.HDF5: entry}, {"frames": demo.frames}, False, demo.source.to_json()
                )
            )
    recordings = []
    for stem, found in by_stem.items():  # file by file in the walk's order, each file's demos by number
        if len(found) == 1:
            recordings.append(found[0])
            continue
        files = " and ".join(r.files[Role.HDF5].path for r in found)
        detail = f"{stem!r} is in {files}: file stems must be unique across the export; rename one"
        rejections.extend(
            Rejection(
                r.files[Role.HDF5].path + (f"#{r.source['key']}" if "key" in r.source else ""),
                Reason.DUPLICATE_STEM,
                detail,
            )
            for r in found
        )
    return recordings


_WALK_REASONS = {
    Reason.SYMLINK_OUTSIDE_EXPORT,
    Reason.SYMLINK_NOT_FOLLOWED,
    Reason.SYMLINK_LOOP,
    Reason.NAME_NOT_UTF8,
}


def _without_copies(recordings: list[Recording]) -> tuple[list[Recording], list[Rejection]]:
    """Keeps the first recording, in stem order, of those whose `_vio.mcap` bytes are identical.

    A copy of a recording under another stem (or a hard or symbolic link to it) would put the
    same demonstration into the dataset twice; which one stays must not depend on the walk.
    """
    kept: dict[str, Recording] = {}
    unique: list[Recording] = []
    rejections: list[Rejection] = []
    for rec in recordings:  # sorted by stem
        vio = rec.files[Role.VIO]
        first = kept.setdefault(vio.sha256, rec)
        if first is rec:
            unique.append(rec)
            continue
        detail = (
            f"{PurePosixPath(vio.path).name} has the same SHA-256 as "
            f"{first.files[Role.VIO].path}: a copy or link of "
            f"recording {first.stem!r}, which is kept; remove the copy"
        )
        rejections.extend(
            Rejection(entry.path, Reason.DUPLICATE_RECORDING, detail) for entry in rec.files.values()
        )
    return unique, rejections


@dataclass(frozen=True)
class _Accepted:
    status: dict[str, Any]
    truncated: bool


@dataclass(frozen=True)
class _Rejected:
    reason: Reason
    detail: str


def _check_recording(
    root: Path, stem: str, files: dict[Role, Path], config: PairConfig
) -> _Accepted | _Rejected:
    """The verdict on one folder's files of one stem; the first failed rule is the reason."""
    names = file_names(stem)
    missing = [names[role] for role in MCAP_ROLES if role not in files]
    if missing:
        return _Rejected(Reason.NOT_PAIRED, f"recording {stem!r} is incomplete: missing {', '.join(missing)}")
    empty = [names[role] for role in MCAP_ROLES if files[role].stat().st_size == 0]
    if empty:
        return _Rejected(Reason.EMPTY, f"{', '.join(empty)} is empty (0 bytes)")

    status = _read_status(files[Role.STATUS])
    if isinstance(status, _Rejected):
        return status
    absent = [k for k in STATUS_REQUIRED_KEYS if k not in status]
    if absent:
        return _Rejected(
            Reason.MISSING_KEYS, f"{names[Role.STATUS]} lacks required key(s) {', '.join(absent)}"
        )
    if status["status"] != STATUS_SUCCESS:
        error = status.get("error") or "no error text given"
        error = _clip(error) if isinstance(error, str) else _quote(error)
        return _Rejected(Reason.STATUS_NOT_SUCCESS, f"status {_quote(status['status'])}: {error}")
    for key, role in (("source", Role.RAW), ("output", Role.VIO)):
        named = status[key]
        if not isinstance(named, str):
            return _Rejected(
                Reason.NAME_MISMATCH,
                f"{names[Role.STATUS]}: {key} is {_quote(named)}, expected {names[role]!r}",
            )
        if PurePosixPath(named).name != named or "\\" in named:
            where = (
                "the export"
                if _points_outside(root, files[Role.STATUS].parent, named)
                else "the recording's folder"
            )
            return _Rejected(
                Reason.SOURCE_NOT_IN_FOLDER,
                f"{names[Role.STATUS]}: {key} {_quote(named)} points outside {where}; "
                "it must name a file next to the json",
            )
        if named != names[role]:
            return _Rejected(
                Reason.NAME_MISMATCH,
                f"{names[Role.STATUS]}: {key} names {_quote(named)}, expected {names[role]!r}",
            )
    task = status.get("task")
    if config.task is not None and task is not None and task != config.task:
        return _Rejected(
            Reason.OTHER_TASK,
            f"task {_quote(task)}, the pipeline is configured for {config.task!r} (pair.task)",
        )

    state, detail = mcap_state(files[Role.RAW])
    if state is not McapState.COMPLETE:
        return _Rejected(Reason(state.value), f"{names[Role.RAW]}: {detail}")
    state, detail = mcap_state(files[Role.VIO])
    if state is McapState.NOT_MCAP:
        return _Rejected(Reason.NOT_MCAP, f"{names[Role.VIO]}: {detail}")
    truncated = state is McapState.TRUNCATED
    if truncated and not config.accept_truncated:
        return _Rejected(
            Reason.TRUNCATED,
            f"{names[Role.VIO]}: {detail}; set pair.accept_truncated: true to convert what is readable",
        )
    return _Accepted(_documented_fields(stem, status), truncated)


def _read_status(path: Path) -> dict[str, Any] | _Rejected:
    """The status json as a dict, or why it is not a valid one."""

    def invalid(why: str) -> _Rejected:
        return _Rejected(Reason.INVALID_JSON, f"{path.name}: {why}")

    def reject_constant(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    # One byte past the limit is enough to know; a huge file is never read whole.
    with open(path, "rb") as f:
        data = f.read(MAX_STATUS_BYTES + 1)
        size = os.fstat(f.fileno()).st_size
    if len(data) > MAX_STATUS_BYTES:
        return _Rejected(
            Reason.TOO_LARGE,
            f"{path.name} is {size} bytes, "
            f"over the {MAX_STATUS_BYTES} bytes a status file may have: not read "
            "(the studio writes a few hundred)",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return invalid(f"not UTF-8 text (byte {exc.start})")
    try:
        value = json.loads(text, parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        return invalid(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
    except ValueError as exc:
        return invalid(f"invalid JSON: {exc}")
    except RecursionError:
        # The parser recurses once per nesting level: `[[[[...` exhausts the stack before any error.
        return invalid("invalid JSON: arrays or objects nested too deeply to parse")
    if not isinstance(value, dict):
        return invalid(f"invalid JSON: expected an object, got {type(value).__name__}")
    return value


def _documented_fields(stem: str, status: dict[str, Any]) -> dict[str, Any]:
    """The status fields the manifest carries: the documented ones, when of the documented type.

    Anything else in the file (extra keys, a nested object where a text belongs) stays out:
    the manifest is hashed and read downstream, and must not carry what the studio never promised.
    """
    fields: dict[str, Any] = {}
    for key, types in STATUS_FIELDS.items():
        if key not in status:
            continue
        value = status[key]
        # A JSON true is an int to Python, but it is no frame count.
        if isinstance(value, types) and not isinstance(value, bool):
            fields[key] = value
        else:
            log.warning(
                "%s: status field %r is %s, of the wrong type: not in the manifest", stem, key, _quote(value)
            )
    undocumented = len(status.keys() - STATUS_FIELDS.keys())
    if undocumented:
        log.debug("%s: %d undocumented status field(s) not copied into the manifest", stem, undocumented)
    return fields


# A status value quoted in a report detail is cut to this: the report is read by people, and a
# status file may hold anything up to MAX_STATUS_BYTES.
_QUOTE_MAX_CHARS = 200


def _clip(text: str) -> str:
    if len(text) <= _QUOTE_MAX_CHARS:
        return text
    return f"{text[:_QUOTE_MAX_CHARS]}... ({len(text)} characters)"


def _quote(value: Any) -> str:
    """A status value as a report detail shows it: repr of a scalar, never a whole nested structure."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    return _clip(repr(value))


def _points_outside(root: Path, folder: Path, named: str) -> bool:
    target = (folder / named).resolve() if not os.path.isabs(named) else Path(named).resolve()
    return not target.is_relative_to(root)


def walk_export(root: Path) -> Iterator[tuple[Path, Reason | None, str | None]]:
    """Yields (path, None, None) for every file to consider, (path, reason, detail) for entries not followed.

    Folder links are never walked into, so the walk ends even where links form a loop. A folder
    that cannot be listed is yielded as unreadable: os.walk would skip it, and its recordings with
    it, without a word.
    """
    unlistable: list[OSError] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable.append, followlinks=False):
        while unlistable:
            yield _unlistable_folder(root, unlistable.pop())
        here = Path(dirpath)
        dirnames.sort()
        for name in list(dirnames):
            path = here / name
            if not _is_utf8(name):
                dirnames.remove(name)
                yield path, Reason.NAME_NOT_UTF8, _NOT_UTF8.format(kind="folder") + " to pair what it holds"
            elif path.is_symlink():
                dirnames.remove(name)
                yield path, *_link_verdict(root, path, "folder")  # never None for a folder
        for name in sorted(filenames):
            path = here / name
            if not _is_utf8(name):
                yield path, Reason.NAME_NOT_UTF8, _NOT_UTF8.format(kind="file")
                continue
            if path.is_symlink():
                verdict = _link_verdict(root, path, "file")
                if verdict is not None:
                    yield path, *verdict
                    continue
            yield path, None, None
    while unlistable:
        yield _unlistable_folder(root, unlistable.pop())


def _unlistable_folder(root: Path, exc: OSError) -> tuple[Path, Reason, str]:
    path = Path(exc.filename)
    if path == root:  # nothing of the export can be paired: not one rejection among others
        raise PermissionError(exc.errno, f"export folder {root} cannot be listed: {exc.strerror}")
    return (
        path,
        Reason.UNREADABLE,
        (
            f"folder cannot be listed ({exc.strerror}): the recordings in it, if any, are not paired; "
            "give this user read and execute permission on it (chmod a+rx), or move it out of the export"
        ),
    )


_NOT_UTF8 = (
    "{kind} name is not valid UTF-8 (its undecodable bytes are shown as \\xNN): "
    "the manifest and report are JSON "
    "text and cannot hold it; rename it"
)


def _is_utf8(name: str) -> bool:
    # os.walk hands back the bytes of a name that is not UTF-8 as lone surrogates (PEP 383).
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _link_verdict(root: Path, path: Path, kind: str) -> tuple[Reason, str] | None:
    """Why a symbolic link is not followed; None for a link to a regular file inside the export."""
    link = os.readlink(path)
    try:
        os.stat(path)  # follows the whole chain: a loop (a -> b -> a) fails here instead of spinning
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return (
                Reason.SYMLINK_LOOP,
                f"symbolic link loop ({link!r} leads back to itself): it never reaches a {kind}",
            )
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return Reason.SYMLINK_NOT_FOLLOWED, f"symbolic link to {link!r}, which does not exist"
        return (
            Reason.SYMLINK_NOT_FOLLOWED,
            f"symbolic link to {link!r}, which cannot be followed: {exc.strerror}",
        )
    target = path.resolve()
    if kind == "folder" and path.parent.is_relative_to(target):
        return (
            Reason.SYMLINK_LOOP,
            f"symbolic link to {link!r}, a folder that contains it: a loop, not followed",
        )
    if not target.is_relative_to(root):
        return Reason.SYMLINK_OUTSIDE_EXPORT, (
            f"symbolic link leading outside the export ({link!r}): not followed; copy the file in instead"
        )
    if kind == "file" and target.is_file():
        return None
    return Reason.SYMLINK_NOT_FOLLOWED, (
        f"symbolic link to a {kind} inside the export: not followed, its files would be listed twice"
    )


def export_relative_path(path: Path, root: Path) -> str:
    """The export-relative POSIX path, always JSON text: bytes of a name that is not UTF-8 (only
    ever in a rejected entry) are written as \\xNN."""
    rel = os.fsencode(path.relative_to(root).as_posix()).decode("utf-8", "backslashreplace")
    return "." if rel == "" else rel


def summary_lines(result: PairingResult) -> list[str]:
    """A short human summary: accepted, then rejected files grouped by reason."""
    metrics = result.metrics()
    lines = [
        f"paired {metrics['recordings_accepted']} recordings"
        + (
            f" ({metrics['recordings_truncated_accepted']} truncated)"
            if metrics["recordings_truncated_accepted"]
            else ""
        )
        + (
            f"; rejected {metrics['demos_rejected']} demos and"
            if "demos_rejected" in metrics
            else "; rejected"
        )
        + f" {metrics['files_rejected']} of {metrics['files_seen']} files"
    ]
    for whose in ("demos", "files"):
        for reason, count in metrics.get(f"{whose}_rejected_by_reason", {}).items():
            example = next(
                r
                for r in result.rejections
                if r.reason.value == reason and ("#" in r.path) == (whose == "demos")
            )
            lines.append(f"  {count:4d} {reason}: e.g. {example.path}: {example.detail}")
    return lines
