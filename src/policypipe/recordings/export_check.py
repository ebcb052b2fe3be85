"""Checking an export before DVC hashes it.

Under `dvc repro`, DVC hashes a stage's dependencies before the stage runs, so it reads every file
of `data/raw` before `pair` can report on any: a named pipe in the export makes it wait forever, a
symbolic link loop fails with the operating system's "Too many levels of symbolic links", a name
that is not UTF-8 with an encoding error that names no file. The pipeline's first stage,
`check_export`, walks the folder as `pair` does (never opening anything but regular files) and
fails naming every such entry; `pair` lists its output before `data/raw` among its dependencies,
which is the order DVC visits them in (tested), so DVC never reaches the export while one is there.

What DVC records for a folder, measured on dvc 3: every entry that is not a folder, without
following links to folders, with the size of what a link to a file leads to. `tracked_files`
counts the same, for the check's summary.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from policypipe.recordings.pairing import Reason, Rejection, export_relative_path, walk_export

# What would make DVC hang or fail while hashing; the other reasons are `pair`'s to report.
_HAZARDS = {Reason.NAME_NOT_UTF8, Reason.UNREADABLE, Reason.SYMLINK_LOOP}


@dataclass(frozen=True)
class TrackedFiles:
    """A folder as DVC records it: the number of files and their bytes (`nfiles`, `size`)."""

    files: int
    bytes: int


def export_hazards(root: Path) -> list[Rejection]:
    """Entries of an export that `dvc add` cannot hash, each with what to do about it."""
    root = Path(root).resolve()
    found: list[Rejection] = []
    for path, reason, detail in walk_export(root):
        if path.is_symlink() and _is_folder_link(path):
            continue  # DVC does not follow links to folders: harmless to it, reported by pair
        if reason in _HAZARDS:
            found.append(Rejection(export_relative_path(path, root), reason, detail))
        elif (problem := _not_hashable(path)) is not None:
            found.append(Rejection(export_relative_path(path, root), *problem))
    return found


def tracked_files(root: Path) -> TrackedFiles:
    """What DVC would record for a folder without hazards (see the module docstring)."""
    files = size = 0
    for dirpath, _folders, filenames in os.walk(root, followlinks=False):
        for name in filenames:  # links to folders are listed among dirnames: not followed, not counted
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # a dangling link: an export_hazards entry, never in DVC's record
            if stat.S_ISREG(st.st_mode):
                files, size = files + 1, size + st.st_size
    return TrackedFiles(files, size)


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
