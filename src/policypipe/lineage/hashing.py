"""Streaming SHA-256 of files and folders, in parallel.

Files are read in fixed-size blocks (constant memory); hashlib releases the GIL while it
digests a block, so a thread pool keeps several disks' worth of reads in flight.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BLOCK_SIZE = 1 << 20


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_files(paths: Iterable[Path], workers: int | None = None) -> dict[Path, str]:
    """SHA-256 of many files, hashed concurrently; result keyed by the given paths."""
    paths = list(dict.fromkeys(paths))
    if workers is None:
        workers = min(8, 2 * (os.cpu_count() or 1))
    if len(paths) <= 1 or workers <= 1:
        return {p: sha256_file(p) for p in paths}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(paths, pool.map(sha256_file, paths)))


def tree_digest(file_digests: Mapping[str, str]) -> str:
    """One SHA-256 for a folder: over sorted (relative POSIX path, file SHA-256) pairs.

    Independent of the folder's location and of the order the file system lists it in.
    """
    h = hashlib.sha256()
    for rel in sorted(file_digests):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(file_digests[rel].encode())
        h.update(b"\n")
    return h.hexdigest()


def sha256_path(path: Path) -> str:
    """SHA-256 of a file, or the tree digest of a folder (symbolic links are not followed)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()]
    digests = sha256_files(files)
    return tree_digest({p.relative_to(path).as_posix(): d for p, d in digests.items()})
