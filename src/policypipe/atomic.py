"""Writes that never leave a half-written file behind.

Every output goes to a temporary name next to its destination, is flushed to disk, and is
renamed into place; a killed process leaves the previous version or nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def canonical_json(obj: Any) -> bytes:
    """The one JSON form of every output: sorted keys, fixed indent, UTF-8, trailing newline.

    Same content, same bytes, on every machine: DVC hashes decide what reruns.
    """
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, canonical_json(obj))


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


MANIFEST = "manifest.json"


def write_folder_atomic(
    folder: Path, writers: dict[str, Callable[[Path], None]], extra: dict[str, Any] | None = None
) -> Path:
    """Builds a folder under a temporary name, then renames it into place.

    `writers` maps file names to functions that write that file. A `manifest.json` with the
    SHA-256 of every file (and `extra`) is added; every file is fsynced before the rename. An
    older folder at the same place is renamed aside and removed only once the new one is in.
    """
    from policypipe.lineage.hashing import sha256_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, write in writers.items():
            write(tmp / name)
        manifest = {"files": {name: sha256_file(tmp / name) for name in writers}} | (extra or {})
        (tmp / MANIFEST).write_bytes(canonical_json(manifest))
        for name in (*writers, MANIFEST):
            _fsync_path(tmp / name)
        _fsync_dir(tmp)
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        _fsync_dir(folder.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def verify_folder(folder: Path) -> list[str]:
    """Files whose SHA-256 differs from the folder's manifest (empty: intact)."""
    from policypipe.lineage.hashing import sha256_file

    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{folder / MANIFEST}: unreadable ({exc})"]
    problems = []
    for name, digest in sorted(manifest.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(path) != digest:
            problems.append(f"{name}: SHA-256 differs from the manifest")
    return problems


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
