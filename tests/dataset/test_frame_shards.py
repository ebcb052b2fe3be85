from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from policypipe.dataset.frame_shards import FrameShardWriter, create_frames_array
from policypipe.dataset.image_codec import decode_jpeg, encode_jpeg
from policypipe.lineage.hashing import sha256_path


def frames(n: int) -> np.ndarray:
    """Smooth colour gradients, a different one per frame (like camera images, unlike noise)."""
    y, x = np.mgrid[0:24, 0:32]
    return np.stack(
        [np.stack([x * 7 + i, y * 9 + 2 * i, (x + y) * 4 + 3 * i], axis=-1) % 256 for i in range(n)]
    ).astype(np.uint8)


@pytest.mark.parametrize("n", [7, 10, 23])  # a partial last shard, exact shards, several
def test_hand_written_shards_are_byte_identical_to_zarrs_own(tmp_path: Path, n: int) -> None:
    data = frames(n)
    ours = zarr.open_group(tmp_path / "ours.zarr", mode="w", zarr_format=3)
    writer = FrameShardWriter(tmp_path / "ours.zarr", create_frames_array(ours, "rgb", n, (32, 24), 10, 95))
    for start in range(0, n, 4):  # episodes of uneven length
        writer.append([encode_jpeg(f, 95) for f in data[start : start + 4]])
    writer.close()

    theirs = zarr.open_group(tmp_path / "theirs.zarr", mode="w", zarr_format=3)
    create_frames_array(theirs, "rgb", n, (32, 24), 10, 95)[:] = data

    assert sha256_path(tmp_path / "ours.zarr") == sha256_path(tmp_path / "theirs.zarr")
    read = zarr.open(tmp_path / "ours.zarr", mode="r")["rgb"]
    assert np.array_equal(read[n - 1], decode_jpeg(np.frombuffer(encode_jpeg(data[n - 1], 95), np.uint8)))
    assert np.abs(read[:].astype(int) - data).mean() < 3  # JPEG q95: close to the original


def test_writer_refuses_a_frame_count_that_does_not_match(tmp_path: Path) -> None:
    group = zarr.open_group(tmp_path / "s.zarr", mode="w", zarr_format=3)
    writer = FrameShardWriter(tmp_path / "s.zarr", create_frames_array(group, "rgb", 25, (32, 24), 10, 95))
    writer.append([encode_jpeg(f, 95) for f in frames(5)])
    with pytest.raises(ValueError, match="25 frames declared"):
        writer.close()


def test_reader_returns_what_zarr_returns_and_checks_the_index(tmp_path: Path) -> None:
    from policypipe.dataset.frame_shards import FrameShardReader, UnreadableFrame

    data = frames(23)
    group = zarr.open_group(tmp_path / "s.zarr", mode="w", zarr_format=3)
    create_frames_array(group, "rgb", 23, (32, 24), 10, 95)[:] = data
    reader = FrameShardReader(tmp_path / "s.zarr", "rgb")
    through_zarr = zarr.open_group(tmp_path / "s.zarr", mode="r")["rgb"]
    assert reader.fast
    for i in (0, 9, 10, 22):
        assert np.array_equal(reader.read(i), through_zarr[i])
    assert np.array_equal(reader.read_many([3, 21]), through_zarr[[3, 21]])
    with pytest.raises(IndexError):
        reader.read(23)

    shard = tmp_path / "s.zarr" / "rgb" / "c" / "1" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 1  # inside the index
    shard.write_bytes(bytes(raw))
    with pytest.raises(UnreadableFrame, match="frame 12 .*checksum"):
        FrameShardReader(tmp_path / "s.zarr", "rgb").read(12)


def test_reader_falls_back_to_zarr_for_other_layouts(tmp_path: Path) -> None:
    from policypipe.dataset.frame_shards import FrameShardReader

    data = frames(12)
    zarr.create_array(tmp_path / "plain.zarr", data=data, chunks=(5, 24, 32, 3))
    reader = FrameShardReader(tmp_path, "plain.zarr")
    assert not reader.fast and np.array_equal(reader.read(7), data[7])
