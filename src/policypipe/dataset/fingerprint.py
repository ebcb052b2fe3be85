"""The dataset's fingerprint: a SHA-256 over its logical content.

Each array is digested over its path, dtype, shape and decoded values (C order, read block by
block along the first axis); the fingerprint is a SHA-256 over the root attributes (canonical
JSON) and those digests in path order. It does not depend on file system order, chunk file
names, chunking, sharding or compression: a copy, or a re-chunked store with the same values,
has the same fingerprint. Any changed value changes it; a corrupt chunk changes it or cannot
be read, and `verify` says which array.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from policypipe.atomic import canonical_json

# Decoded values read per step: the peak memory of every stage that fingerprints (convert, stats,
# verify) is about this much above its imports, whatever the dataset's size.
BLOCK_BYTES = 8 << 20


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    arrays: dict[str, str]  # array path -> SHA-256 of its logical content


class UnreadableArray(Exception):
    def __init__(self, path: str, cause: Exception) -> None:
        super().__init__(f"{path}: cannot be read ({type(cause).__name__}: {cause})")
        self.path = path


def array_paths(root: zarr.Group) -> list[str]:
    return sorted(path for path, member in root.members(max_depth=None) if isinstance(member, zarr.Array))


def array_digest(array: zarr.Array) -> str:
    h = hashlib.sha256(canonical_json({"dtype": str(array.dtype), "shape": list(array.shape)}))
    if array.ndim == 0:
        h.update(np.ascontiguousarray(array[...]).tobytes())
        return h.hexdigest()
    row_bytes = max(int(np.prod(array.shape[1:])) * array.dtype.itemsize, 1)
    rows = max(1, BLOCK_BYTES // row_bytes)
    for start in range(0, array.shape[0], rows):
        # The block's own buffer, not a copy of it (`tobytes` would hold the block twice).
        h.update(memoryview(np.ascontiguousarray(array[start : start + rows])).cast("B"))
    return h.hexdigest()


def fingerprint(store: Path | zarr.Group) -> Fingerprint:
    root = store if isinstance(store, zarr.Group) else zarr.open_group(store, mode="r")
    arrays = {}
    for path in array_paths(root):
        try:
            arrays[path] = array_digest(root[path])
        except Exception as exc:  # noqa: BLE001 - any failure to decode is damage to report
            raise UnreadableArray(path, exc) from exc
    h = hashlib.sha256(b"policypipe-dataset-fingerprint-v1\n")
    h.update(canonical_json(dict(root.attrs)))
    h.update(canonical_json(arrays))
    return Fingerprint(h.hexdigest(), arrays)


def compare(actual: Fingerprint, expected_digest: str, expected_arrays: dict[str, str] | None) -> list[str]:
    """What differs, in words; empty when the store is what was recorded."""
    if actual.digest == expected_digest:
        return []
    if not expected_arrays:
        return [f"fingerprint {actual.digest[:16]}..., recorded {expected_digest[:16]}..."]
    problems = []
    for path in sorted(set(actual.arrays) | set(expected_arrays)):
        have, want = actual.arrays.get(path), expected_arrays.get(path)
        if have is None:
            problems.append(f"{path}: missing")
        elif want is None:
            problems.append(f"{path}: not in the recorded dataset")
        elif have != want:
            problems.append(f"{path}: content differs")
    return problems or ["the root attributes (episode records, params) differ"]


def store_files(store: Path) -> dict[str, str]:
    """SHA-256 of every file of the store, by relative path: the byte-level record."""
    from policypipe.lineage.hashing import sha256_files

    store = Path(store)
    files = sorted(p for p in store.rglob("*") if p.is_file())
    return {p.relative_to(store).as_posix(): d for p, d in sha256_files(files).items()}


def compare_files(actual: dict[str, str], expected: dict[str, str]) -> list[str] | None:
    """Damaged files, when the store has the recorded file layout; None for another layout.

    The logical fingerprint ignores bytes that do not change a decoded value (a JPEG header
    field, say); a copy in the recorded layout must match byte for byte. A re-chunked copy has
    other files and is judged by its logical content alone.
    """
    if set(actual) != set(expected):
        return None
    return [f"{path}: bytes differ" for path in sorted(actual) if actual[path] != expected[path]]
