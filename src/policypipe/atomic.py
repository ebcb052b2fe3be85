"""Writes that never leave a half-written file behind.

Every output goes to a temporary name next to its destination, is flushed to disk, and is
renamed into place; a killed process leaves the previous version or nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
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
