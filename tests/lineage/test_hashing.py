from __future__ import annotations

import hashlib
from pathlib import Path

from policypipe.lineage.hashing import sha256_files, sha256_path, tree_digest


def test_streaming_hash_equals_hashlib_on_files_larger_than_a_block(tmp_path: Path) -> None:
    payloads = {f"f{i}": bytes(range(256)) * (4096 * (i + 1)) + bytes([i]) for i in range(5)}
    paths = []
    for name, data in payloads.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)

    serial = sha256_files(paths, workers=1)
    parallel = sha256_files(paths, workers=4)

    assert serial == parallel == {tmp_path / n: hashlib.sha256(d).hexdigest() for n, d in payloads.items()}


def test_folder_digest_depends_on_content_and_names_not_on_location(tmp_path: Path) -> None:
    for root in ("a", "b"):
        (tmp_path / root / "sub").mkdir(parents=True)
        (tmp_path / root / "x.bin").write_bytes(b"one")
        (tmp_path / root / "sub" / "y.bin").write_bytes(b"two")
    assert sha256_path(tmp_path / "a") == sha256_path(tmp_path / "b")

    (tmp_path / "b" / "sub" / "y.bin").write_bytes(b"twO")
    assert sha256_path(tmp_path / "a") != sha256_path(tmp_path / "b")
    assert tree_digest({"x": "1", "y": "2"}) != tree_digest({"x": "2", "y": "1"})
