"""Checking an export before anything hashes it, and hashing it safely for the pipeline.

DVC hashes a stage's dependencies before it runs the stage. Were `data/raw` a dependency of
`pair`, DVC would read every file of it before `pair` could report on any: a named pipe in the
export makes it wait forever, a symbolic link loop fails with the operating system's "Too many
levels of symbolic links", a name that is not UTF-8 with an encoding error that names no file.
So the pipeline's first stage, `check_export`, walks the folder as `pair` does, never opening
anything but regular files, fails naming every such entry, and otherwise writes what the export
holds: its file count, bytes and one SHA-256 over its files (`ExportListing.content`, the digest
`pair` records as the export's). `pair` depends on that record, not on the folder, so DVC never walks
the export during `dvc repro`; a file's hash is kept in a local cache while its size, mtime and
inode stay the same, as DVC's own state database does, so an unchanged export is not read again.

What `dvc add` records for a folder, measured on dvc 3: every entry that is not a folder,
without following links to folders, with the size of what a link to a file leads to.
`ExportListing.tracked` counts the same, so the check can say when `data/raw.dvc` no longer describes
the folder (new recordings not versioned yet for `dvc push`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from policypipe.atomic import write_json_atomic
from policypipe.lineage.hashing import sha256_files, tree_digest
from policypipe.recordings.pairing import Reason, Rejection, export_relative_path, walk_export

# What would make DVC hang or fail while hashing; the other reasons are `pair`'s to report.
_HAZARDS = {Reason.NAME_NOT_UTF8, Reason.UNREADABLE, Reason.SYMLINK_LOOP}


@dataclass(frozen=True)
class TrackedFiles:
    """A folder as DVC records it: the number of files and their bytes (`nfiles`, `size`)."""

    files: int
    bytes: int


@dataclass(frozen=True)
class ExportContent:
    """The files `pair` reads (regular files, links to files inside the export), and their digest."""

    files: int
    bytes: int
    sha256: str  # tree_digest of their SHA-256 by export-relative path: pair's `export_sha256`


@dataclass(frozen=True)
class ExportListing:
    """One walk of an export (`pairing.walk_export`), which the check's three questions share:
    what cannot be read, what `pair` will read and its digest, and what DVC would record."""

    root: Path  # as given: messages name it so
    entries: tuple[tuple[Path, Reason | None, str | None], ...]

    @classmethod
    def of(cls, root: Path) -> ExportListing:
        return cls(Path(root), tuple(walk_export(Path(root).resolve())))

    def hazards(self) -> list[Rejection]:
        """Entries that `dvc add` or a reader cannot take, each with what to do about it."""
        base = self.root.resolve()
        found: list[Rejection] = []
        for path, reason, detail in self.entries:
            if path.is_symlink() and _is_folder_link(path):
                continue  # DVC does not follow links to folders: harmless to it, reported by pair
            if reason in _HAZARDS:
                found.append(Rejection(export_relative_path(path, base), reason, detail))
            elif (problem := _not_hashable(path)) is not None:
                found.append(Rejection(export_relative_path(path, base), *problem))
        return found

    def tracked(self) -> TrackedFiles:
        """What DVC would record for the folder without hazards (see the module docstring): the
        entries that lead to regular files, links to folders neither followed nor counted."""
        files = size = 0
        for path, _, _ in self.entries:
            try:
                st = os.stat(path)
            except OSError:
                continue  # a dangling link: a hazard, never in DVC's record
            if stat.S_ISREG(st.st_mode):
                files, size = files + 1, size + st.st_size
        return TrackedFiles(files, size)

    def content(self, cache_path: Path) -> ExportContent:
        """What `pair` will read, hashed; a file whose size, mtime and inode are those of the cache
        entry keeps its hash. Only after `hazards` found nothing (no pipe is ever opened)."""
        base = self.root.resolve()
        files = {export_relative_path(p, base): p for p, reason, _ in self.entries if reason is None}
        stats = {rel: os.stat(path) for rel, path in files.items()}
        keys = {rel: [st.st_size, st.st_mtime_ns, st.st_ino] for rel, st in stats.items()}
        cached = _read_cache(cache_path)
        digests = {rel: cached[rel][1] for rel in files if _entry(cached.get(rel)) == keys[rel]}
        fresh = sha256_files([files[rel] for rel in files if rel not in digests])
        digests |= {rel: fresh[files[rel]] for rel in files if rel not in digests}
        if digests.keys() != cached.keys() or fresh:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache_path, {rel: [keys[rel], digests[rel]] for rel in sorted(digests)})
        return ExportContent(len(files), sum(st.st_size for st in stats.values()), tree_digest(digests))


def _entry(entry: object) -> list | None:
    """The (size, mtime, inode) of a cache entry [[size, mtime_ns, inode], sha256]; None when malformed."""
    ok = (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], list)
        and isinstance(entry[1], str)
    )
    return entry[0] if ok else None


def _read_cache(path: Path) -> dict[str, list]:
    try:
        cache = json.loads(Path(path).read_text())
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: everything is hashed again


def recorded_files(pointer: Path) -> TrackedFiles | None:
    """`nfiles` and `size` from a `.dvc` file written by `dvc add`; None where it has none."""
    try:
        out = yaml.safe_load(Path(pointer).read_text())["outs"][0]
        return TrackedFiles(int(out["nfiles"]), int(out["size"]))
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        return None


def unversioned_change(listing: ExportListing, pointer: Path) -> str | None:
    """Why `pointer` (`data/raw.dvc`) no longer describes the folder, or None where it does or
    where there is none: the pipeline runs on the folder, `dvc push` sends what the pointer names."""
    recorded = recorded_files(pointer)
    now = listing.tracked()
    root = listing.root
    if recorded is None or recorded == now:
        return None
    return (
        f"{root} holds {now.files} files ({now.bytes:,} bytes), {pointer} records {recorded.files} "
        f"({recorded.bytes:,} bytes): the pipeline runs on the folder as it is, but `dvc push` sends "
        f"the version {pointer} names. Run `dvc add {root}` and commit {pointer} to version this one"
    )


def _is_folder_link(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _not_hashable(path: Path) -> tuple[Reason, str] | None:
    try:
        st = os.stat(path)  # follows links, as DVC does
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Reason.SYMLINK_LOOP, "symbolic link loop: it never reaches a file; remove the link"
        return Reason.UNREADABLE, f"cannot be read ({exc.strerror}): remove it or fix what it points to"
    if not stat.S_ISREG(st.st_mode):
        # DVC would open a named pipe and wait for a writer forever.
        return Reason.UNREADABLE, "not a regular file (a named pipe, socket or device): move it out"
    try:
        with open(path, "rb"):
            return None
    except OSError as exc:
        return Reason.UNREADABLE, f"cannot be read ({exc.strerror}): fix its permissions (chmod a+r)"
