"""`policypipe verify` for a dataset: is this store the one the pipeline recorded?

Compares the store with the record `stats` wrote (`data/stats/stats.json`: the fingerprint,
each array's digest and every file's SHA-256). Damage is named file by file (`CORRUPT`), a
different content array by array (`MISMATCH`); a store that cannot even be opened is damage to
report, never a traceback.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import zarr

from policypipe.dataset.fingerprint import compare, compare_files, fingerprint, store_files


@dataclass(frozen=True)
class StoreVerdict:
    status: Literal["OK", "CORRUPT", "MISMATCH"]
    problems: list[str]  # one entry per damaged or missing file, or differing array
    digest: str | None = None  # the store's fingerprint, when it could be computed
    same_layout: bool = False  # the files are the recorded ones (not a re-chunked copy)
    unopened: bool = False  # the store could not be read at all


def verify_store(target: Path, recorded: dict[str, Any]) -> StoreVerdict:
    """`recorded`: the record's `dataset_fingerprint` ({"sha256", "arrays"?, "files"?})."""
    # Metadata that is not JSON stops zarr before any array is read, with an error that does
    # not say which file: name it, and the damaged files, without opening the store.
    unreadable = _unreadable_metadata(target)
    damaged = (
        _damaged_files(store_files(target), recorded["files"], set(unreadable))
        if recorded.get("files")
        else None
    )
    if unreadable:
        problems = [f"{path}: {why}" for path, why in unreadable.items()]
        problems += [d for d in damaged or [] if d.split(": ", 1)[0] not in unreadable]
        return StoreVerdict("CORRUPT", problems, unopened=True)
    try:
        actual = fingerprint(target)
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read is damage to report, not a crash
        return StoreVerdict("CORRUPT", [one_line(exc), *(damaged or [])], unopened=True)
    problems = compare(actual, recorded["sha256"], recorded.get("arrays"))
    if problems and damaged is None:
        # zarr reads a chunk whose file is gone as fill values: without the record's file list,
        # a deleted file would show only as changed content.
        differing = [p for p in actual.arrays if actual.arrays[p] != (recorded.get("arrays") or {}).get(p)]
        damaged = _absent_chunk_files(target, differing) or None
    if damaged:
        return StoreVerdict("CORRUPT", damaged + problems, actual.digest, True)
    if problems:
        return StoreVerdict("MISMATCH", problems, actual.digest, damaged is not None)
    return StoreVerdict("OK", [], actual.digest, damaged is not None)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _damaged_files(
    actual: dict[str, str], expected: dict[str, str], unreadable: set[str]
) -> list[str] | None:
    """Damaged and missing files when the store has the recorded layout, or that layout less some
    files; None for another layout (a re-chunked copy, judged by its content alone).

    A store whose readable metadata files all match the record, with no file the record lacks,
    is the recorded layout: a recorded file it lacks was deleted or never arrived.
    """
    if set(actual) - set(expected):
        return None
    metadata = [p for p in actual if p.rsplit("/", 1)[-1] == "zarr.json" and p not in unreadable]
    if set(actual) != set(expected) and any(actual[p] != expected[p] for p in metadata):
        return None
    missing = [f"{p}: missing" for p in sorted(set(expected) - set(actual))]
    return missing + (compare_files(actual, {p: expected[p] for p in actual}) or [])


def _unreadable_metadata(store: Path) -> dict[str, str]:
    """The store's zarr.json files that are not a JSON object: relative path -> why."""
    problems = {}
    for path in sorted(store.rglob("zarr.json")):
        try:
            if not isinstance(json.loads(path.read_bytes()), dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            problems[path.relative_to(store).as_posix()] = f"unreadable metadata ({one_line(exc)})"
    return problems


def _absent_chunk_files(store: Path, arrays: list[str]) -> list[str]:
    """Chunk (or shard) files of these arrays that their metadata says exist and are not on disk.

    zarr leaves out chunks that hold only the fill value, so an absent file is damage only in an
    array whose content differs from the record; only those are checked.
    """
    root = zarr.open_group(store, mode="r")
    absent = []
    for path in arrays:
        array = root[path]
        block = array.shards or array.chunks
        grid = [math.ceil(size / b) for size, b in zip(array.shape, block)]
        for coords in itertools.product(*(range(n) for n in grid)):
            key = array.metadata.chunk_key_encoding.encode_chunk_key(coords)
            if not (store / path / key).is_file():
                absent.append(f"{path}/{key}: missing")
    return absent
