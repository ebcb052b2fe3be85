"""The fingerprint follows the logical content; `policypipe verify` catches any damage."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.fingerprint import fingerprint, store_files


def rechunked_copy(src: Path, dst: Path) -> None:
    """The same values in another layout: other chunks, no shards, lossless blosc for images."""
    old = zarr.open_group(src, mode="r")
    new = zarr.open_group(dst, mode="w", zarr_format=3)
    for path, member in old.members(max_depth=None):
        if isinstance(member, zarr.Array):
            chunks = (7,) + member.shape[1:] if member.ndim else ()
            new.create_array(path, data=member[:], chunks=chunks, compressors=[BloscCodec(cname="lz4")])
    new.attrs.update(dict(old.attrs))


def test_same_content_same_fingerprint_whatever_the_layout(store: Path, tmp_path: Path) -> None:
    shutil.copytree(store, tmp_path / "copy.zarr")
    rechunked_copy(store, tmp_path / "rechunked.zarr")
    original = fingerprint(store)
    assert fingerprint(tmp_path / "copy.zarr") == original
    assert fingerprint(tmp_path / "rechunked.zarr") == original
    assert set(original.arrays) == {
        layout.RGB,
        layout.EEF_POS,
        layout.EEF_ROT,
        layout.GRIPPER_WIDTH,
        layout.TIMESTAMP,
        layout.EPISODE_ENDS,
        layout.POSE_TIMESTAMP,
        layout.POSE_POS,
        layout.POSE_ROT,
        layout.WIDTH_TIMESTAMP,
        layout.WIDTH,
        layout.POSE_EPISODE_ENDS,
        layout.WIDTH_EPISODE_ENDS,
    }


@pytest.mark.parametrize(
    "key", [layout.EEF_POS, layout.TIMESTAMP, layout.RGB, layout.POSE_TIMESTAMP, layout.WIDTH, "attrs"]
)
def test_any_changed_value_changes_it(store: Path, key: str) -> None:
    before = fingerprint(store)
    root = zarr.open_group(store, mode="r+")
    if key == "attrs":
        root.attrs[layout.ATTRS_FREQUENCY] = 30.000001
    elif key == layout.RGB:
        frame = root[key][17]
        frame[0, 0, 0] ^= 0x80
        root[key][17] = frame
    else:
        values = root[key][:]
        values[5] = np.nextafter(values[5], np.inf)  # the smallest possible change
        root[key][:] = values
    after = fingerprint(store)
    assert after.digest != before.digest
    if key != "attrs":
        assert [p for p in after.arrays if after.arrays[p] != before.arrays[p]] == [key]


def verify(store: Path, record: Path) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("policypipe")
    return subprocess.run(
        [str(cli), "verify", str(store), "--record", str(record)], capture_output=True, text=True
    )


def record_of(store: Path, path: Path) -> Path:
    fp = fingerprint(store)
    write_json_atomic(
        path, {"dataset_fingerprint": {"sha256": fp.digest, "arrays": fp.arrays, "files": store_files(store)}}
    )
    return path


def test_verify_passes_on_the_recorded_store_a_copy_and_a_rechunked_copy(store: Path, tmp_path: Path) -> None:
    record = record_of(store, tmp_path / "stats.json")
    shutil.copytree(store, tmp_path / "server" / "ds.zarr")
    rechunked_copy(store, tmp_path / "rechunked.zarr")
    for target in (store, tmp_path / "server" / "ds.zarr", tmp_path / "rechunked.zarr"):
        done = verify(target, record)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("OK ") and done.stdout.count("\n") == 1
    assert "another layout" in done.stdout


@pytest.mark.parametrize(
    ("chunk", "where"),
    [
        ("data/camera0_rgb/c/1/0/0/0", 0.3),  # inside a JPEG frame
        ("data/camera0_rgb/c/1/0/0/0", -0.001),  # in the shard index
        ("data/robot0_eef_pos/c/1/0", 0.5),  # a compressed low-dimensional chunk
        ("meta/episode_ends/c/0", 0.5),
    ],
)
def test_verify_catches_a_single_flipped_byte(store: Path, tmp_path: Path, chunk: str, where: float) -> None:
    record = record_of(store, tmp_path / "stats.json")
    path = store / chunk
    data = bytearray(path.read_bytes())
    offset = int(len(data) * where) % len(data)
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))

    done = verify(store, record)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("CORRUPT")
    assert f"{chunk}: bytes differ" in done.stdout  # names the file


def test_verify_without_a_record_says_what_to_pass(store: Path, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("policypipe")
    done = subprocess.run([str(cli), "verify", str(store)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "--record" in done.stderr


def test_memory_stays_near_one_block_whatever_the_array_size(tmp_path: Path) -> None:
    # 64 MB blocks, each copied again by tobytes, took the convert stage's process from 112 MB of
    # imports to 301 MB on the demo dataset: fingerprinting is in convert, stats and verify.
    import tracemalloc

    values = np.random.default_rng(0).random((5_000_000, 2))  # 80 MB
    root = zarr.open_group(tmp_path / "big.zarr", mode="w", zarr_format=3)
    root.create_array("x", data=values, chunks=(250_000, 2))
    del values
    tracemalloc.start()
    fingerprint(tmp_path / "big.zarr")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # What the array's 80 MB would not fit in: one block, zarr's decoding of it, no copies.
    assert peak < 48 * 2**20, f"{peak / 2**20:.0f} MB traced"
