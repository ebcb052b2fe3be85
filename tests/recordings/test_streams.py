"""Reading the streams of a _vio.mcap: topic mapping from params, other pose schemas, camera topic
candidates, and damaged files (bad messages, damaged chunks, with or without a summary) that lose
only what is damaged."""

from __future__ import annotations

import io
import json
import logging
import struct
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from mcap.data_stream import ReadDataStream
from mcap.opcode import Opcode
from mcap.reader import NonSeekingReader, make_reader
from mcap.records import Channel, Chunk, ChunkIndex, Message
from mcap.stream_reader import breakup_chunk
from mcap.writer import CompressionType, IndexType, Writer
from mcap_protobuf.schema import build_file_descriptor_set

from policypipe.config import ConfigError, from_mapping
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import build_episode
from policypipe.recordings.messages import RecordingError, Topics
from policypipe.recordings.streams import FramesInFile, Streams, read_streams
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.recording import StreamTiming, write_vio_mcap
from tests.conftest import mcap_samples

START_NS = 1_762_160_000_000_000_000


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "r_vio.mcap"
    rng = np.random.default_rng(3)
    write_vio_mcap(path, plan_motion(rng, START_NS, duration_s=2.0), StreamTiming(), rng, image_size=(64, 48))
    return path


def rewrite_pose_as_transforms(src: Path, dst: Path) -> int:
    """The same recording with /vio/pose replaced by /tf FrameTransforms, plus a distractor frame."""
    schema = FrameTransform.DESCRIPTOR
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        writer = Writer(fout)
        writer.start()
        tf_schema = writer.register_schema(
            schema.full_name, "protobuf", build_file_descriptor_set(FrameTransform).SerializeToString()
        )
        tf = writer.register_channel("/tf", "protobuf", tf_schema)
        channels: dict[int, int] = {}
        poses = 0
        for sch, channel, message in make_reader(fin).iter_messages(log_time_order=False):
            if channel.topic == "/vio/pose":
                pose = PoseInFrame.FromString(message.data)
                for child, offset in (("gripper", 0.0), ("camera", 0.5)):
                    t = FrameTransform(parent_frame_id="world", child_frame_id=child)
                    t.timestamp.CopyFrom(pose.timestamp)
                    t.translation.x = pose.pose.position.x + offset
                    t.translation.y, t.translation.z = pose.pose.position.y, pose.pose.position.z
                    t.rotation.CopyFrom(pose.pose.orientation)
                    writer.add_message(
                        tf,
                        log_time=message.log_time,
                        publish_time=message.log_time,
                        data=t.SerializeToString(),
                    )
                poses += 1
                continue
            if channel.id not in channels:
                sid = writer.register_schema(sch.name, sch.encoding, sch.data)
                channels[channel.id] = writer.register_channel(channel.topic, channel.message_encoding, sid)
            writer.add_message(
                channels[channel.id],
                log_time=message.log_time,
                publish_time=message.log_time,
                data=message.data,
            )
        writer.finish()
    return poses


def test_frame_transform_pose_of_the_configured_child_frame(recording: Path, tmp_path: Path) -> None:
    reference = read_streams(recording, Topics())
    poses = rewrite_pose_as_transforms(recording, tmp_path / "tf_vio.mcap")

    streams = read_streams(tmp_path / "tf_vio.mcap", Topics(pose="/tf", pose_child_frame="gripper"))

    assert len(streams.pose_ns) == poses == len(reference.pose_ns)
    assert np.array_equal(streams.pose_ns, reference.pose_ns)
    assert np.allclose(streams.position, reference.position) and np.allclose(
        streams.quaternion, reference.quaternion
    )


def test_missing_topic_names_the_topics_that_are_there(recording: Path) -> None:
    with pytest.raises(RecordingError) as info:
        read_streams(recording, Topics(pose="/slam/pose"))
    assert info.value.reason == "missing_topic"
    assert "no messages on /slam/pose" in str(info.value)
    assert "/vio/pose (foxglove.PoseInFrame)" in str(info.value) and "/gripper/width (GripperWidth)" in str(
        info.value
    )


def test_capture_times_come_from_the_messages_not_log_time(recording: Path) -> None:
    streams = read_streams(recording, Topics())
    with open(recording, "rb") as f:
        log_times = [
            m.log_time
            for _, c, m in make_reader(f).iter_messages(log_time_order=False)
            if c.topic == "/camera0/image"
        ]
    assert len(log_times) == len(streams.camera_ns)
    assert not np.array_equal(np.asarray(log_times), streams.camera_ns)
    assert streams.camera_format == "jpeg" and streams.truncated is None


# ---------------------------------------------------------------- damaged files (issue 11)
#
# Real MCAP files: a recording written by the simulator, its messages copied with the mcap
# Writer (small chunks, so a file has many), then damaged by editing bytes on disk.


class Item(NamedTuple):
    """One message to write: its channel (by topic) and its bytes."""

    topic: str
    schema_name: str
    schema_encoding: str
    schema_data: bytes
    message_encoding: str
    log_time: int
    data: bytes


def read_items(path: Path) -> list[Item]:
    """Every message of a file, in file order."""
    with open(path, "rb") as f:
        return [
            Item(c.topic, s.name, s.encoding, s.data, c.message_encoding, m.log_time, m.data)
            for s, c, m in NonSeekingReader(f).iter_messages(log_time_order=False)
        ]


def write_items(
    path: Path,
    items: list[Item],
    *,
    chunk_size: int = 8 * 1024,
    compression: CompressionType = CompressionType.ZSTD,
    index_types: IndexType = IndexType.ALL,
    summary: bool = True,
    **writer_options,
) -> Path:
    """The items in this order, with the mcap Writer: chunked, and (by default) a summary with
    chunk and message indexes, repeated channels and statistics, and chunk CRCs."""
    with open(path, "wb") as f:
        writer = Writer(
            f,
            chunk_size=chunk_size,
            compression=compression,
            index_types=index_types if summary else IndexType.NONE,
            repeat_channels=summary,
            repeat_schemas=summary,
            use_statistics=summary,
            use_summary_offsets=summary,
            **writer_options,
        )
        writer.start(profile="", library="policypipe-tests")
        channels: dict[str, int] = {}
        for item in items:
            if item.topic not in channels:
                schema = writer.register_schema(item.schema_name, item.schema_encoding, item.schema_data)
                channels[item.topic] = writer.register_channel(item.topic, item.message_encoding, schema)
            writer.add_message(
                channels[item.topic], log_time=item.log_time, publish_time=item.log_time, data=item.data
            )
        writer.finish()
    return path


def flip_bytes(path: Path, offset: int, count: int = 8) -> None:
    """Inverts `count` bytes from `offset` in place: damage a transfer or a disk leaves."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def chunk_contents(path: Path) -> list[tuple[ChunkIndex, list[tuple[str, bytes]]]]:
    """Per chunk, in file order: its index and its messages as (topic, data)."""
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
        out = []
        for index in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
            f.seek(index.chunk_start_offset + 1 + 8)  # past the opcode and the record length
            records = breakup_chunk(Chunk.read(ReadDataStream(f)))
            out.append(
                (
                    index,
                    [
                        (summary.channels[r.channel_id].topic, r.data)
                        for r in records
                        if isinstance(r, Message)
                    ],
                )
            )
    return out


def chunk_data_offset(index: ChunkIndex) -> int:
    """Where a chunk's (compressed) records start: after opcode, length, start and end times,
    uncompressed size, CRC, compression name and records length."""
    return index.chunk_start_offset + 1 + 8 + 8 + 8 + 8 + 4 + 4 + len(index.compression) + 8


def capture_ns(topic: str, data: bytes) -> int:
    if topic == "/camera0/image":
        return CompressedImage.FromString(data).timestamp.ToNanoseconds()
    if topic == "/vio/pose":
        return PoseInFrame.FromString(data).timestamp.ToNanoseconds()
    return json.loads(data)["stamp_ns"]


STREAM_OF = {"/camera0/image": "camera", "/vio/pose": "pose", "/gripper/width": "width"}


def expected_without(chunks, damaged: set[int]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Capture times per stream in the chunks that are not damaged, and the message counts per
    stream of those that are (only nonzero)."""
    kept: dict[str, list[int]] = {name: [] for name in STREAM_OF.values()}
    lost: Counter[str] = Counter()
    for i, (_, messages) in enumerate(chunks):
        for topic, data in messages:
            if i in damaged:
                lost[STREAM_OF[topic]] += 1
            else:
                kept[STREAM_OF[topic]].append(capture_ns(topic, data))
    return kept, dict(lost)


def assert_kept(streams, kept: dict[str, list[int]]) -> None:
    assert streams.camera_ns.tolist() == kept["camera"]
    assert streams.pose_ns.tolist() == kept["pose"]
    assert streams.width_ns.tolist() == kept["width"]


def assert_read_again_alike(path: Path, streams) -> None:
    """Frames not held (`hold_frames=False`, `policypipe predict`'s reading) are read again from the
    file one at a time: the same frames as those held, the same damage skipped."""
    lazy = read_streams(path, Topics(), hold_frames=False)
    assert isinstance(lazy.cameras[0].data, FramesInFile)
    assert len(lazy.camera_data) == len(streams.camera_data)
    assert list(lazy.camera_data) == streams.camera_data
    assert np.array_equal(lazy.camera_ns, streams.camera_ns) and lazy.lost == streams.lost


@pytest.fixture(scope="module")
def items(recording: Path) -> list[Item]:
    return read_items(recording)


def with_camera_at(recording_items: list[Item], index: int) -> int:
    """The index of the `index`-th camera message."""
    return [i for i, it in enumerate(recording_items) if it.topic == "/camera0/image"][index]


@pytest.mark.parametrize(
    ("compression", "where"),
    [
        (CompressionType.ZSTD, "records"),
        (CompressionType.LZ4, "records"),
        (CompressionType.NONE, "records"),
        (CompressionType.ZSTD, "compressed stream"),
        (CompressionType.LZ4, "compressed stream"),
        (CompressionType.ZSTD, "record length"),
    ],
)
def test_a_damaged_chunk_is_skipped_and_counted_and_every_other_chunk_is_kept(
    items: list[Item], tmp_path: Path, caplog, compression: CompressionType, where: str
) -> None:
    path = write_items(tmp_path / "r_vio.mcap", items, compression=compression)
    chunks = chunk_contents(path)
    assert len(chunks) >= 6
    # A chunk in the middle that holds messages of all three streams.
    middle = next(
        i
        for i in range(len(chunks) // 2, len(chunks))
        if {STREAM_OF[t] for t, _ in chunks[i][1]} == {"camera", "pose", "width"}
    )
    index = chunks[middle][0]
    if where == "records":  # bytes in the middle of the (compressed) records
        flip_bytes(path, index.chunk_start_offset + index.chunk_length // 2)
    elif where == "compressed stream":  # the compressor's own frame: it cannot decompress
        flip_bytes(path, chunk_data_offset(index) + 8, 4)
    else:  # the record's length field: the chunk's framing itself
        flip_bytes(path, index.chunk_start_offset + 3, 4)
    kept, lost = expected_without(chunks, {middle})

    with caplog.at_level(logging.WARNING, logger="policypipe.recordings.streams"):
        streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert streams.lost == lost and set(lost) == {"camera", "pose", "width"}
    assert len(streams.camera_data) == len(kept["camera"])
    assert_read_again_alike(path, streams)
    why = {
        "records": "",
        "compressed stream": "cannot decompress",
        "record length": "not the chunk the index describes",
    }[where]
    assert len(streams.damage) == 1 and streams.damage[0].startswith(
        f"chunk at byte {index.chunk_start_offset}: {why}"
    )
    assert streams.damage[0].endswith(
        f"lost {lost['camera']} camera, {lost['pose']} pose, {lost['width']} width messages"
    )
    if compression == CompressionType.NONE:
        assert (
            "CRC mismatch" in streams.damage[0]
        )  # the bytes decompress (they are not compressed): the CRC says
    assert any(streams.damage[0] in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_the_first_and_the_last_chunk_damaged_the_channels_come_from_the_summary(
    items: list[Item], tmp_path: Path
) -> None:
    # The first chunk holds the schema and channel records: the summary repeats them.
    path = write_items(tmp_path / "r_vio.mcap", items)
    chunks = chunk_contents(path)
    for index, _ in (chunks[0], chunks[-1]):
        flip_bytes(path, index.chunk_start_offset + index.chunk_length // 2, 16)
    kept, lost = expected_without(chunks, {0, len(chunks) - 1})

    streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert streams.lost == lost
    assert [d.split(":")[0] for d in streams.damage] == [
        f"chunk at byte {c[0].chunk_start_offset}" for c in (chunks[0], chunks[-1])
    ]


def test_a_damaged_chunk_without_message_index_is_counted_from_the_statistics(
    items: list[Item], tmp_path: Path
) -> None:
    path = write_items(tmp_path / "r_vio.mcap", items, index_types=IndexType.CHUNK)
    chunks = chunk_contents(path)
    assert not chunks[2][0].message_index_offsets
    flip_bytes(path, chunks[2][0].chunk_start_offset + chunks[2][0].chunk_length // 2)
    kept, lost = expected_without(chunks, {2})

    streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert streams.lost == lost
    assert "no message index" in streams.damage[0] and "from the summary statistics" in streams.damage[1]


def test_an_intact_file_reads_the_same_chunk_by_chunk_as_in_one_pass(
    items: list[Item], tmp_path: Path
) -> None:
    indexed = read_streams(write_items(tmp_path / "indexed_vio.mcap", items), Topics())
    one_pass = read_streams(write_items(tmp_path / "plain_vio.mcap", items, summary=False), Topics())

    for name in ("camera_ns", "pose_ns", "position", "quaternion", "width_ns", "width"):
        a, b = getattr(indexed, name), getattr(one_pass, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert indexed.camera_data == one_pass.camera_data
    assert (indexed.camera_format, indexed.camera_topic, indexed.truncated) == (
        "jpeg",
        "/camera0/image",
        None,
    )
    assert (
        indexed.lost == one_pass.lost == {}
        and indexed.damage == one_pass.damage == []
        and indexed.warnings == []
    )


def image_message(seconds: int, data: bytes = b"\xff\xd8 not really a jpeg", fmt: str = "jpeg") -> bytes:
    msg = CompressedImage(frame_id="camera0", data=data, format=fmt)
    msg.timestamp.seconds = seconds
    return msg.SerializeToString()


def pose_message(seconds: int) -> bytes:
    msg = PoseInFrame(frame_id="world")
    msg.timestamp.seconds = seconds
    msg.pose.orientation.w = 1.0
    return msg.SerializeToString()


BAD_MESSAGES = {
    # name: (topic, bytes, stream, what the damage line says)
    "garbage camera": (
        "/camera0/image",
        b"\xff\xff\xff\xff garbage",
        "camera",
        "not a valid foxglove.CompressedImage",
    ),
    "camera beyond int64": ("/camera0/image", image_message(2**62), "camera", "beyond int64"),
    "garbage pose": ("/vio/pose", b"\x0a\x05ab", "pose", "not a valid foxglove.PoseInFrame"),
    "pose beyond int64": ("/vio/pose", pose_message(2**62), "pose", "beyond int64"),
    "malformed width": ("/gripper/width", b'{"stamp_ns": 17621600', "width", "malformed JSON"),
    "width without value": (
        "/gripper/width",
        b'{"stamp_ns": 1762160000000000000}',
        "width",
        "malformed JSON",
    ),
    "width nested too deeply": ("/gripper/width", b"[" * 100_000 + b"]" * 100_000, "width", "malformed JSON"),
    "width beyond int64": (
        "/gripper/width",
        b'{"stamp_ns": 1180591620717411303424, "width_m": 0.05}',
        "width",
        "beyond int64",
    ),
}


@pytest.mark.parametrize("bad", sorted(BAD_MESSAGES))
def test_one_bad_message_is_skipped_and_counted_and_reading_goes_on(
    recording: Path, items: list[Item], tmp_path: Path, bad: str
) -> None:
    topic, data, stream, kind = BAD_MESSAGES[bad]
    template = next(it for it in items if it.topic == topic)
    at = with_camera_at(items, 5)  # early in the file: everything after it must still be read
    damaged = [*items[:at], template._replace(data=data), *items[at:]]
    path = write_items(tmp_path / "r_vio.mcap", damaged)

    streams = read_streams(path, Topics())
    reference = read_streams(recording, Topics())

    assert streams.truncated is None
    for name in ("camera_ns", "pose_ns", "position", "quaternion", "width_ns", "width"):
        assert np.array_equal(getattr(streams, name), getattr(reference, name)), name
    assert streams.camera_data == reference.camera_data
    assert streams.lost == {stream: 1}
    assert_read_again_alike(path, streams)
    assert len(streams.damage) == 1 and streams.damage[0].startswith(
        f"{stream}: skipped 1 message(s) on {topic}: "
    )
    assert kind in streams.damage[0]


def test_every_width_message_malformed_is_a_clear_error(items: list[Item], tmp_path: Path) -> None:
    path = write_items(
        tmp_path / "r_vio.mcap",
        [it._replace(data=b"{}") if it.topic == "/gripper/width" else it for it in items],
    )
    width_messages = sum(it.topic == "/gripper/width" for it in items)
    with pytest.raises(RecordingError, match=f"all {width_messages} messages on /gripper/width") as info:
        read_streams(path, Topics())
    assert info.value.reason == "bad_width_message"


def test_zero_length_camera_frames_are_kept_as_empty_frames(
    recording: Path, items: list[Item], tmp_path: Path
) -> None:
    template = next(it for it in items if it.topic == "/camera0/image")
    at = with_camera_at(items, 5)
    empty_frame = image_message(1_762_160_001, data=b"")  # a message without frame bytes
    path = write_items(
        tmp_path / "r_vio.mcap",
        [*items[:at], template._replace(data=empty_frame), template._replace(data=b""), *items[at:]],
    )

    streams = read_streams(path, Topics())

    reference = read_streams(recording, Topics())
    assert streams.camera_data == [*reference.camera_data[:5], b"", b"", *reference.camera_data[5:]]
    assert streams.camera_ns.tolist() == [
        *reference.camera_ns[:5].tolist(),
        1_762_160_001 * 10**9,
        0,
        *reference.camera_ns[5:].tolist(),
    ]
    assert streams.camera_format == "jpeg" and streams.lost == {} and streams.truncated is None


# ---------------------------------------------------------------- damaged files without a summary (issue 19)
#
# No chunk index to skip by: the reader walks the records by their framing (opcode, length).


class FileChunk(NamedTuple):
    offset: int
    length: int  # of the whole record: opcode, length field, content


def file_chunks(path: Path) -> list[tuple[FileChunk, list[tuple[str, bytes]]]]:
    """Per chunk, in file order, found by walking the records as written: where it is and its
    messages as (topic, data)."""
    data = path.read_bytes()
    pos, topics, out = 8, {}, []
    while pos < len(data):
        opcode, length = struct.unpack_from("<BQ", data, pos)
        if opcode == Opcode.DATA_END:
            break
        if opcode == Opcode.CHUNK:
            records = breakup_chunk(Chunk.read(ReadDataStream(io.BytesIO(data[pos + 9 : pos + 9 + length]))))
            topics |= {r.id: r.topic for r in records if isinstance(r, Channel)}
            messages = [(topics[r.channel_id], r.data) for r in records if isinstance(r, Message)]
            out.append((FileChunk(pos, 9 + length), messages))
        pos += 9 + length
    return out


def without_summary(path: Path) -> Path:
    """Cuts a file's summary (and footer) off, where a crashed writer leaves the file: after the
    last chunk and its message index records, before the DataEnd record."""
    data = path.read_bytes()
    footer_start = len(data) - 8 - (1 + 8 + 20)
    summary_start = struct.unpack_from("<Q", data, footer_start + 9)[0]
    data_end = summary_start - (1 + 8 + 4)
    assert data[data_end] == Opcode.DATA_END
    path.write_bytes(data[:data_end])
    return path


# Where to damage chunk 2 of a file: (what the damage line says, bytes to invert from its start).
NO_SUMMARY_DAMAGE = {
    # In the middle of the compressed records: zstd's own checks or the CRC find it.
    "records": (("cannot decompress", "CRC mismatch"), lambda c: (c.offset + c.length // 2, 8)),
    # The compressed stream's magic number (after the fields up to the compression name, the name
    # and the records' length): it cannot decompress.
    "compressed stream": (("cannot decompress",), lambda c: (c.offset + 9 + 32 + len("zstd") + 8, 4)),
    # The CRC field itself (after opcode, length, start and end time, uncompressed size).
    "crc field": (("CRC mismatch",), lambda c: (c.offset + 9 + 24, 4)),
}


@pytest.mark.parametrize("where", sorted(NO_SUMMARY_DAMAGE))
def test_without_a_summary_a_damaged_chunk_is_skipped_and_every_chunk_after_it_is_kept(
    items: list[Item], tmp_path: Path, caplog, where: str
) -> None:
    path = write_items(tmp_path / "r_vio.mcap", items, summary=False)
    chunks = file_chunks(path)
    assert len(chunks) >= 6
    damaged = chunks[1][0]
    says, at = NO_SUMMARY_DAMAGE[where]
    flip_bytes(path, *at(damaged))
    kept, _ = expected_without(chunks, {1})

    with caplog.at_level(logging.WARNING, logger="policypipe.recordings.streams"):
        streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert len(streams.camera_data) == len(kept["camera"])
    assert_read_again_alike(path, streams)
    # Without a message index its messages cannot be counted: the line says so, and where and
    # when the chunk was.
    assert streams.lost == {}
    (line,) = streams.damage
    assert line.startswith(f"chunk at byte {damaged.offset}: ") and any(s in line for s in says), line
    assert f"bytes {damaged.offset} to {damaged.offset + damaged.length}, its header gives log times " in line
    assert line.endswith(": lost messages not known (no message index follows it)")
    assert any(line in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_without_a_summary_an_uncompressed_chunk_with_a_flipped_frame_byte_is_found_by_its_crc(
    items: list[Item], tmp_path: Path
) -> None:
    # Uncompressed: the flipped bytes still parse as a frame, and only the CRC tells.
    path = write_items(tmp_path / "r_vio.mcap", items, compression=CompressionType.NONE, summary=False)
    chunks = file_chunks(path)
    victim = next(data for topic, data in chunks[1][1] if topic == "/camera0/image")
    flip_bytes(path, path.read_bytes().index(victim) + len(victim) // 2, 4)
    kept, _ = expected_without(chunks, {1})

    streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert len(streams.damage) == 1 and streams.damage[0].startswith(
        f"chunk at byte {chunks[1][0].offset}: CRC mismatch"
    )


def test_without_a_summary_a_damaged_length_field_is_stepped_over_to_the_next_sound_chunk(
    items: list[Item], tmp_path: Path
) -> None:
    path = write_items(tmp_path / "r_vio.mcap", items, summary=False)
    chunks = file_chunks(path)
    damaged, after = chunks[1][0], chunks[2][0]
    flip_bytes(path, damaged.offset + 3, 4)  # the length now runs far past the end of the file
    kept, _ = expected_without(chunks, {1})

    streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    assert streams.lost == {}
    (line,) = streams.damage
    assert line.startswith(
        f"bytes {damaged.offset} to {after.offset}: a chunk record: its length field says "
    )
    assert "its header gives log times" in line and "read on from the next chunk that checks out" in line


def test_without_a_summary_a_length_that_lands_inside_the_file_is_found_out_by_the_fields(
    items: list[Item], tmp_path: Path
) -> None:
    # The length is too short by one byte: it points inside the chunk's own records, which the
    # chunk's fields (its records' length) do not fit.
    path = write_items(tmp_path / "r_vio.mcap", items, summary=False)
    chunks = file_chunks(path)
    damaged = chunks[1][0]
    with open(path, "r+b") as f:
        f.seek(damaged.offset + 1)
        f.write(struct.pack("<Q", damaged.length - 9 - 1))
    kept, _ = expected_without(chunks, {1})

    streams = read_streams(path, Topics())

    assert streams.truncated is None
    assert_kept(streams, kept)
    (line,) = streams.damage
    assert line.startswith(f"bytes {damaged.offset} to {chunks[2][0].offset}: a chunk record: its records (")


def test_a_crashed_writer_s_file_counts_a_damaged_chunk_s_messages_from_its_message_index(
    items: list[Item], tmp_path: Path
) -> None:
    # An indexing writer that crashed: message index records after every chunk, no summary.
    path = without_summary(write_items(tmp_path / "r_vio.mcap", items))
    chunks = file_chunks(path)
    damaged = chunks[1][0]
    flip_bytes(path, damaged.offset + damaged.length // 2)
    kept, lost = expected_without(chunks, {1})

    streams = read_streams(path, Topics())

    assert_kept(streams, kept)
    assert streams.lost == lost and set(lost) == {"camera", "pose", "width"}
    (line,) = streams.damage
    assert line.startswith(f"chunk at byte {damaged.offset}: ")
    assert line.endswith(f"lost {lost['camera']} camera, {lost['pose']} pose, {lost['width']} width messages")
    # No DataEnd record: the file was cut, after its last whole record.
    assert streams.truncated == (
        f"reading stopped after {len(kept['camera'])} camera frames: the file ends at byte "
        f"{path.stat().st_size}, before its DataEnd record: it was cut"
    )


def test_a_cut_copy_with_a_damaged_length_reads_on_past_it_up_to_the_cut(
    items: list[Item], tmp_path: Path
) -> None:
    # A cut copy (no footer, no summary) whose middle chunk's length is damaged too.
    path = write_items(tmp_path / "r_vio.mcap", items)
    chunks = chunk_contents(path)
    middle = len(chunks) // 2
    flip_bytes(path, chunks[middle][0].chunk_start_offset + 3, 4)
    path.write_bytes(path.read_bytes()[: chunks[-1][0].chunk_start_offset + 100])  # mid-chunk
    kept, _ = expected_without(chunks, {middle, len(chunks) - 1})

    streams = read_streams(path, Topics())

    assert streams.truncated is not None and streams.truncated.startswith(
        f"reading stopped after {len(kept['camera'])} camera frames: a chunk record at byte "
        f"{chunks[-1][0].chunk_start_offset}: its length field says"
    )
    assert streams.truncated.endswith(
        "no readable chunk follows: the file was cut there (or all that follows is damaged)"
    )
    assert_kept(streams, kept)
    assert [line.split(":")[0] for line in streams.damage] == [
        f"bytes {chunks[middle][0].chunk_start_offset} to {chunks[middle + 1][0].chunk_start_offset}"
    ]


def test_without_a_summary_a_damaged_first_chunk_takes_the_channels_and_the_error_says_so(
    items: list[Item], tmp_path: Path
) -> None:
    # The mcap Writer puts schema and channel records into the chunk of their first message.
    path = write_items(tmp_path / "r_vio.mcap", items, summary=False)
    chunks = file_chunks(path)
    flip_bytes(path, chunks[0][0].offset + chunks[0][0].length // 2)
    later = sum(len(messages) for _, messages in chunks[1:])

    with pytest.raises(RecordingError) as info:
        read_streams(path, Topics())

    assert info.value.reason == "missing_topic"
    message = str(info.value)
    assert f"the file is damaged: chunk at byte {chunks[0][0].offset}: " in message
    assert f"skipped {later} other messages whose channel or schema record is missing" in message


def test_without_a_summary_a_data_section_crc_mismatch_is_reported(items: list[Item], tmp_path: Path) -> None:
    # Messages outside chunks have no CRC of their own; the data section's CRC covers them.
    path = write_items(
        tmp_path / "r_vio.mcap", items, summary=False, use_chunking=False, enable_data_crcs=True
    )
    victim = next(it.data for it in items[len(items) // 2 :] if it.topic == "/camera0/image")
    flip_bytes(path, path.read_bytes().index(victim) + len(victim) // 2, 4)

    streams = read_streams(path, Topics())

    assert streams.truncated is None and len(streams.camera_ns) == sum(
        it.topic == "/camera0/image" for it in items
    )
    assert streams.damage == [
        "data section: its CRC does not match, while every chunk's own check held: a record outside the "
        "chunks is damaged: lost messages not known (records outside chunks carry no CRC of their own)"
    ]


def test_the_sample_export_recording_without_summary_keeps_seven_of_eight_chunks(tmp_path: Path) -> None:
    # Issue 19: in the stock sample export, a recording written without summary, chunk 2 of 8
    # damaged, was excluded as "too_short: 24 usable frames" with no word of the damage.
    export = write_sample_export(tmp_path / "export", SampleConfig(recordings=6, defects=False), workers=1)
    vios = sorted(export.root.rglob("*_vio.mcap"))
    (path,) = [p for p in vios if not file_has_summary(p)]
    # The export's recordings also hold /diagnostics messages, which a dataset does not read.
    chunks = [(at, [m for m in messages if m[0] in STREAM_OF]) for at, messages in file_chunks(path)]
    assert len(chunks) == 8
    damaged = chunks[1][0]
    flip_bytes(path, damaged.offset + damaged.length // 2)
    kept, _ = expected_without(chunks, {1})

    streams = read_streams(path, Topics())
    episode = build_episode(streams, ConvertConfig())

    assert_kept(streams, kept)
    assert len(episode.capture_ns) > 0.8 * sum(t == "/camera0/image" for _, m in chunks for t, _ in m)
    assert [w.split(":")[:2] for w in episode.warnings if w.startswith("damaged")] == [
        ["damaged recording", f" chunk at byte {damaged.offset}"]
    ]


def file_has_summary(path: Path) -> bool:
    with open(path, "rb") as f:
        return make_reader(f).get_summary() is not None


# ---------------------------------------------------------------- camera topic candidates


@pytest.fixture(scope="module")
def video_recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("video") / "v_vio.mcap"
    rng = np.random.default_rng(3)
    write_vio_mcap(
        path,
        plan_motion(rng, START_NS, duration_s=2.0),
        StreamTiming(),
        rng,
        camera="video",
        image_size=(64, 48),
    )
    return path


def test_a_video_recording_uses_the_video_candidate(video_recording: Path) -> None:
    streams = read_streams(video_recording, Topics())

    with open(video_recording, "rb") as f:
        frames = sum(
            c.topic == "/camera0/video" for _, c, _ in make_reader(f).iter_messages(log_time_order=False)
        )
    assert streams.camera_topic == "/camera0/video" and streams.camera_format == "h264"
    assert len(streams.camera_ns) == len(streams.camera_data) == frames > 0
    assert streams.warnings == [] and streams.lost == {}


def test_the_first_candidate_with_messages_is_used_and_a_second_one_is_a_warning(
    recording: Path, video_recording: Path, items: list[Item], tmp_path: Path, caplog
) -> None:
    video = [it for it in read_items(video_recording) if it.topic == "/camera0/video"]
    path = write_items(tmp_path / "both_vio.mcap", [*items, *video])

    with caplog.at_level(logging.WARNING, logger="policypipe.recordings.streams"):
        image_first = read_streams(path, Topics())
    video_first = read_streams(path, Topics(camera=("/camera0/video", "/camera0/image")))

    assert image_first.camera_topic == "/camera0/image" and image_first.camera_format == "jpeg"
    assert image_first.camera_data == read_streams(recording, Topics()).camera_data
    assert (
        len(image_first.warnings) == 1
        and "used /camera0/image, ignored /camera0/video" in image_first.warnings[0]
    )
    assert any(image_first.warnings[0] in r.getMessage() for r in caplog.records)
    assert video_first.camera_topic == "/camera0/video" and video_first.camera_format == "h264"
    assert len(video_first.camera_data) == len(video)


def test_no_camera_candidate_with_messages_names_every_candidate(items: list[Item], tmp_path: Path) -> None:
    path = write_items(tmp_path / "r_vio.mcap", [it for it in items if it.topic != "/camera0/image"])
    with pytest.raises(RecordingError) as info:
        read_streams(path, Topics())
    assert info.value.reason == "missing_topic"
    assert "no messages on /camera0/image or /camera0/video;" in str(info.value)
    assert "topics present: /gripper/width (GripperWidth), /vio/pose (foxglove.PoseInFrame)" in str(
        info.value
    )


def test_camera_candidates_from_params_a_list_or_one_topic() -> None:
    assert Topics().camera == ("/camera0/image", "/camera0/video")
    assert from_mapping(Topics, {"camera": ["/cam/video", "/cam/image"]}, "convert.topics").camera == (
        "/cam/video",
        "/cam/image",
    )
    assert from_mapping(Topics, {"camera": "/cam/image"}, "convert.topics").camera == ("/cam/image",)
    assert Topics(camera="/cam/image") == Topics(camera=("/cam/image",))
    with pytest.raises(ConfigError, match="camera"):
        from_mapping(Topics, {"camera": []}, "convert.topics")
    with pytest.raises(ConfigError, match="listed twice"):
        from_mapping(Topics, {"camera": ["/a", "/a"]}, "convert.topics")


# ---------------------------------------------------------------- what callers get


def test_streams_built_without_the_new_fields_report_nothing_lost() -> None:
    empty = np.zeros(0, np.int64)
    streams = Streams.of_one_gripper(
        empty, [], "jpeg", empty, np.zeros((0, 3)), np.zeros((0, 4)), empty, np.zeros(0), None
    )
    assert (streams.camera_topic, streams.lost, streams.damage, streams.warnings) == ("", {}, [], [])


def test_every_real_public_mcap_is_a_missing_topic(tmp_path: Path) -> None:
    samples = sorted(mcap_samples().rglob("*.mcap"))
    assert len(samples) >= 15, f"expected the 15 shared MCAP samples or more, found {len(samples)}"
    for sample in samples:
        with pytest.raises(RecordingError) as info:
            read_streams(sample, Topics())
        assert info.value.reason == "missing_topic", sample.name
        assert "no messages on /camera0/image or /camera0/video" in str(info.value), sample.name


def test_frames_not_held_are_refused_when_the_file_changed_between_the_readings(
    items: list[Item], tmp_path: Path
) -> None:
    path = write_items(tmp_path / "r_vio.mcap", items)
    streams = read_streams(path, Topics(), hold_frames=False)
    at = with_camera_at(items, 5)
    write_items(path, items[:at])  # rewritten meanwhile: five frames left
    with pytest.raises(RecordingError, match="5 frames on /camera0/image on a second reading"):
        list(streams.camera_data)


def test_a_file_that_cannot_be_opened_raises_its_error_not_damage(tmp_path: Path) -> None:
    folder = tmp_path / "r_vio.mcap"
    folder.mkdir()  # a folder where a recording should be
    with pytest.raises(IsADirectoryError):
        read_streams(folder, Topics())
    with pytest.raises(IsADirectoryError):
        read_streams(folder, Topics(), hold_frames=False)
