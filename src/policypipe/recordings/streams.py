"""Reading the streams of a `_vio.mcap` that a dataset needs: camera, pose, gripper width.

Messages are read in file order, one of two ways:

- The file has a summary section with chunk indexes (an indexed writer that finished): chunk by
  chunk through the indexes. Each chunk's decompression and CRC are checked; a damaged chunk is
  skipped, its messages are counted as lost (`Streams.lost`, `Streams.damage`) and reading goes
  on with the next chunk.
- Otherwise (a writer that crashed leaves no summary; a writer that never indexes): one pass
  with `NonSeekingReader`, with or without chunks, any chunk compression. On a truncated or
  damaged file it keeps what was readable before the damage (`Streams.truncated`).

One bad message (bytes that are not the protobuf or JSON they should be, a capture time beyond
int64 nanoseconds) is skipped and counted as lost; it never stops reading. Capture times come
from inside the messages (`timestamp`, `stamp_ns`), never from MCAP `log_time`, and stay
integer nanoseconds.
"""

from __future__ import annotations

import io
import json
import logging
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from google.protobuf.message import DecodeError
from mcap.data_stream import ReadDataStream
from mcap.exceptions import McapError
from mcap.opcode import Opcode
from mcap.reader import FOOTER_SIZE, NonSeekingReader, SeekingReader
from mcap.records import Channel, Chunk, ChunkIndex, Footer, Message, MessageIndex, Schema
from mcap.stream_reader import MAGIC_SIZE, CRCValidationError, StreamReader, breakup_chunk
from mcap.summary import Summary

log = logging.getLogger(__name__)

IMAGE_SCHEMA = "foxglove.CompressedImage"
VIDEO_SCHEMA = "foxglove.CompressedVideo"
POSE_SCHEMA = "foxglove.PoseInFrame"
TRANSFORM_SCHEMA = "foxglove.FrameTransform"

STREAM_NAMES = ("camera", "pose", "width")  # the keys of `Streams.lost`
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_RECORD_SIZE_LIMIT = 1 << 30


class RecordingError(Exception):
    """A recording that cannot become an episode; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Topics:
    """`convert.topics` in params.yaml: which stream feeds which key (recording-format.md)."""

    # Camera topic candidates, in order of preference: per recording, the first one with
    # messages in the file is used (foxglove.CompressedImage or foxglove.CompressedVideo), so
    # an export may mix image and video recordings. One string is one candidate; it is
    # normalised to a tuple when built.
    camera: str | tuple[str, ...] = ("/camera0/image", "/camera0/video")
    pose: str = "/vio/pose"
    width: str = "/gripper/width"
    # For a `foxglove.FrameTransform` pose topic: the child frame that is the gripper.
    pose_child_frame: str | None = None
    width_stamp_field: str = "stamp_ns"
    width_value_field: str = "width_m"

    def __post_init__(self) -> None:
        camera = (self.camera,) if isinstance(self.camera, str) else tuple(self.camera)
        if not camera or not all(isinstance(t, str) and t for t in camera):
            raise ValueError(
                f"camera={self.camera!r}: give one topic or a list of candidate topics, "
                "e.g. [/camera0/image, /camera0/video]"
            )
        if len(set(camera)) != len(camera):
            raise ValueError(f"camera={list(camera)}: a topic is listed twice")
        object.__setattr__(self, "camera", camera)


@dataclass
class Streams:
    camera_ns: np.ndarray  # int64 (M,), capture time of each camera message, file order
    camera_data: list[bytes]  # (M,) compressed frames
    camera_format: str  # "jpeg" | "png" | "h264"
    pose_ns: np.ndarray  # int64 (P,)
    position: np.ndarray  # float64 (P, 3), metres
    quaternion: np.ndarray  # float64 (P, 4), x y z w as written (not yet validated)
    width_ns: np.ndarray  # int64 (W,)
    width: np.ndarray  # float64 (W,), metres
    truncated: str | None  # why reading stopped early, or None
    camera_topic: str = ""  # which of `Topics.camera` was used
    lost: dict[str, int] = field(
        default_factory=dict
    )  # "camera"/"pose"/"width" -> messages lost, nonzero only
    damage: list[str] = field(default_factory=list)  # one line per damaged chunk or kind of skipped message
    warnings: list[str] = field(default_factory=list)  # e.g. two camera candidates with messages


def read_streams(path: Path, topics: Topics) -> Streams:
    reading = _Reading(topics)
    with open(path, "rb") as f:
        summary = _chunk_summary(f, path)
        f.seek(0)
        if summary is None:
            # CRCs checked: a flipped byte in a chunk stops reading there (and says so), rather
            # than passing damaged frames on as sound.
            reader = NonSeekingReader(f, record_size_limit=_RECORD_SIZE_LIMIT, validate_crcs=True)
            messages = reader.iter_messages(log_time_order=False)
        else:
            messages = _indexed_messages(f, summary, reading)
        try:
            for schema, channel, message in messages:
                reading.add(schema.name if schema is not None else "", channel, message)
        except RecordingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to read records past this point is damage to the file
            reading.stopped = f"{type(exc).__name__}: {exc}"
    return reading.finish(path)


# ---------------------------------------------------------------- messages -> streams


@dataclass
class _Camera:
    """What one camera candidate topic holds; the choice between candidates waits for the end."""

    ns: list[int] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    formats: set[str] = field(default_factory=set)
    messages: int = 0  # message records seen on the topic, readable or not
    wrong_schema: str | None = None


@dataclass
class _Skipped:
    count: int
    first: str


class _Reading:
    """Collects messages in file order into streams, and everything lost on the way."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.cameras: dict[str, _Camera] = {t: _Camera() for t in topics.camera}
        self.pose_ns: list[int] = []
        self.pose: list[tuple[float, ...]] = []
        self.width_ns: list[int] = []
        self.width: list[float] = []
        self.seen: dict[str, str] = {}  # topic -> schema name, for messages about missing topics
        self.stopped: str | None = None  # why reading stopped early
        # Lost messages by topic (the camera topic is chosen at the end): skipped one by one...
        self.skipped: dict[tuple[str, str], _Skipped] = {}  # (topic, what was wrong) -> count, first example
        # ... or with their chunk: (chunk offset, why, lost messages by topic or None if unknown).
        self.chunks: list[tuple[int, str, Counter[str] | None]] = []
        self.unindexed_lost: Counter[str] | None = (
            None  # lost in chunks without message index, from statistics
        )

    def add(self, schema_name: str, channel: Channel, message: Message) -> None:
        topic = channel.topic
        self.seen.setdefault(topic, schema_name)
        if topic in self.cameras:
            self._add_camera(self.cameras[topic], schema_name, topic, message.data)
        elif topic == self.topics.pose:
            self._add_pose(schema_name, topic, message.data)
        elif topic == self.topics.width:
            if channel.message_encoding != "json":
                raise _wrong_schema(topic, f"{schema_name} ({channel.message_encoding})", "a JSON channel")
            try:
                stamp, value = _read_width(message.data, self.topics)
            except _BadMessage as exc:
                self._skip(topic, exc.kind, exc.detail)
                return
            self.width_ns.append(stamp)
            self.width.append(value)

    def _add_camera(self, camera: _Camera, schema_name: str, topic: str, data: bytes) -> None:
        camera.messages += 1
        if schema_name not in (IMAGE_SCHEMA, VIDEO_SCHEMA):
            # Raised only if this candidate is the one used: another may have the frames.
            camera.wrong_schema = camera.wrong_schema or schema_name
            return
        try:
            msg = _parse(CompressedImage if schema_name == IMAGE_SCHEMA else CompressedVideo, data)
            stamp = _checked_stamp(msg.timestamp)
        except _BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        camera.ns.append(stamp)
        camera.data.append(msg.data)  # a zero-length frame stays: the decoder counts it as undecodable
        if msg.format:  # a message without a format (an empty one) says nothing about the others
            camera.formats.add(msg.format.lower())

    def _add_pose(self, schema_name: str, topic: str, data: bytes) -> None:
        try:
            sample = _read_pose(schema_name, data, self.topics, topic)
        except _BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        if sample is not None:
            self.pose_ns.append(sample[0])
            self.pose.append(sample[1])

    def _skip(self, topic: str, kind: str, detail: str) -> None:
        skipped = self.skipped.setdefault((topic, kind), _Skipped(0, detail))
        skipped.count += 1

    def lose_chunk(self, offset: int, why: str, lost: Counter[str] | None) -> None:
        self.chunks.append((offset, why, lost))

    def _lost_by_topic(self) -> Counter[str]:
        lost: Counter[str] = Counter()
        for (topic, _), skipped in self.skipped.items():
            lost[topic] += skipped.count
        for _, _, chunk_lost in self.chunks:
            lost.update(chunk_lost or {})
        lost.update(self.unindexed_lost or {})
        return lost

    def finish(self, path: Path) -> Streams:
        topics = self.topics
        lost_by_topic = self._lost_by_topic()
        camera_topic, warnings = self._choose_camera(lost_by_topic)
        camera = self.cameras[camera_topic]
        stream_topic = {"camera": camera_topic, "pose": topics.pose, "width": topics.width}
        lost = {name: lost_by_topic[t] for name, t in stream_topic.items() if lost_by_topic[t]}
        damage = self._damage_lines(stream_topic)
        truncated = None
        if self.stopped is not None:
            truncated = f"reading stopped after {len(camera.ns)} camera frames: {self.stopped}"
            log.warning("%s: %s", path.name, truncated)
        for line in [*damage, *warnings]:
            log.warning("%s: %s", path.name, line)

        if camera.messages and camera.wrong_schema is not None:
            raise _wrong_schema(camera_topic, camera.wrong_schema, f"{IMAGE_SCHEMA} or {VIDEO_SCHEMA}")
        width_bad = sum(s.count for (t, _), s in self.skipped.items() if t == topics.width)
        if not self.width_ns and width_bad:
            first = next(s.first for (t, _), s in self.skipped.items() if t == topics.width)
            raise RecordingError(
                "bad_width_message",
                f"all {width_bad} messages on {topics.width} are unreadable or lack "
                f"{topics.width_stamp_field!r}/{topics.width_value_field!r}; first: {first}",
            )
        camera_name = (
            camera_topic if camera.messages or lost_by_topic[camera_topic] else " or ".join(topics.camera)
        )
        for name, topic, what in (
            ("camera", camera_name, camera.ns),
            ("pose", topics.pose, self.pose_ns),
            ("width", topics.width, self.width_ns),
        ):
            if not what:
                present = (
                    ", ".join(f"{t} ({s or 'no schema'})" for t, s in sorted(self.seen.items())) or "none"
                )
                detail = " before the file was cut" if truncated else ""
                if lost.get(name):
                    detail += f" ({lost[name]} lost: {'; '.join(damage)})"
                raise RecordingError(
                    "missing_topic", f"no messages on {topic}{detail}; topics present: {present}"
                )

        pose_arr = np.asarray(self.pose, dtype=np.float64).reshape(-1, 7)
        return Streams(
            camera_ns=np.asarray(camera.ns, dtype=np.int64),
            camera_data=camera.data,
            camera_format=_single_format(camera.formats, camera_topic),
            pose_ns=np.asarray(self.pose_ns, dtype=np.int64),
            position=pose_arr[:, :3],
            quaternion=pose_arr[:, 3:],
            width_ns=np.asarray(self.width_ns, dtype=np.int64),
            width=np.asarray(self.width, dtype=np.float64),
            truncated=truncated,
            camera_topic=camera_topic,
            lost=lost,
            damage=damage,
            warnings=warnings,
        )

    def _choose_camera(self, lost_by_topic: Counter[str]) -> tuple[str, list[str]]:
        """The first candidate with messages in the file (read or lost), else the first one."""
        present = [t for t in self.topics.camera if self.cameras[t].messages or lost_by_topic[t]]
        if not present:
            return self.topics.camera[0], []
        warnings = []
        if len(present) > 1:
            others = ", ".join(f"{t} ({self.cameras[t].messages} messages)" for t in present[1:])
            warnings.append(
                f"camera: more than one candidate topic has messages; used {present[0]}, ignored {others}"
            )
        return present[0], warnings

    def _damage_lines(self, stream_topic: dict[str, str]) -> list[str]:
        name_of = {t: name for name, t in stream_topic.items()}

        def counts(lost: Counter[str]) -> str:
            parts = [f"{lost[t]} {name}" for name, t in stream_topic.items() if lost[t]]
            other = sum(n for t, n in lost.items() if t not in name_of)
            if other:
                parts.append(f"{other} other")
            return ", ".join(parts) or "no"

        lines = []
        for offset, why, lost in self.chunks:
            if lost is None:
                lines.append(
                    f"chunk at byte {offset}: {why}: lost messages not known (the chunk has no message index)"
                )
            else:
                lines.append(f"chunk at byte {offset}: {why}: lost {counts(lost)} messages")
        if self.unindexed_lost is not None:
            lines.append(
                f"chunks without message index: lost {counts(self.unindexed_lost)} messages "
                "(from the summary statistics)"
            )
        for (topic, kind), skipped in self.skipped.items():
            name = name_of.get(topic, topic)
            lines.append(
                f"{name}: skipped {skipped.count} message(s) on {topic}: {kind} (first: {skipped.first})"
            )
        return lines


class _BadMessage(Exception):
    """One message that cannot be read; reading goes on without it."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def _parse(cls, data: bytes):
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise _BadMessage(
            f"not a valid {cls.DESCRIPTOR.full_name}", f"{len(data)} bytes {data[:16]!r}: {exc}"
        ) from exc


def _checked_stamp(ts) -> int:
    """Capture time in ns; it must fit in int64 (the arrays it goes into)."""
    ns = int(ts.seconds) * 1_000_000_000 + int(ts.nanos)
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise _BadMessage("capture time beyond int64 nanoseconds", f"seconds={ts.seconds}, nanos={ts.nanos}")
    return ns


def _read_pose(
    schema_name: str, data: bytes, topics: Topics, topic: str
) -> tuple[int, tuple[float, ...]] | None:
    """(capture ns, (x, y, z, qx, qy, qz, qw)), or None for a transform of another frame."""
    if schema_name == POSE_SCHEMA:
        msg = _parse(PoseInFrame, data)
        p, q = msg.pose.position, msg.pose.orientation
    elif schema_name == TRANSFORM_SCHEMA:
        msg = _parse(FrameTransform, data)
        if topics.pose_child_frame is not None and msg.child_frame_id != topics.pose_child_frame:
            return None
        p, q = msg.translation, msg.rotation
    else:
        raise _wrong_schema(topic, schema_name, f"{POSE_SCHEMA} or {TRANSFORM_SCHEMA}")
    return _checked_stamp(msg.timestamp), (p.x, p.y, p.z, q.x, q.y, q.z, q.w)


def _read_width(data: bytes, topics: Topics) -> tuple[int, float]:
    try:
        obj = json.loads(data)
        stamp, value = int(obj[topics.width_stamp_field]), float(obj[topics.width_value_field])
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise _BadMessage(
            f"malformed JSON or no {topics.width_stamp_field!r}/{topics.width_value_field!r}",
            f"{data[:80]!r}: {type(exc).__name__}: {exc}",
        ) from exc
    if not _INT64_MIN <= stamp <= _INT64_MAX:
        raise _BadMessage(f"{topics.width_stamp_field} beyond int64 nanoseconds", f"{data[:80]!r}")
    return stamp, value


def _wrong_schema(topic: str, got: str, expected: str) -> RecordingError:
    return RecordingError("unexpected_schema", f"{topic} has schema {got or 'none'!r}, expected {expected}")


def _single_format(formats: set[str], topic: str) -> str:
    if len(formats) != 1:
        what = f"mixes frame formats {sorted(formats)}" if formats else "has no frame format"
        raise RecordingError("mixed_camera_formats", f"{topic} {what}")
    (fmt,) = formats
    if fmt not in ("jpeg", "jpg", "png", "h264"):
        raise RecordingError(
            "unsupported_camera_format", f"{topic} frames are {fmt!r}; supported: jpeg, png, h264"
        )
    return "jpeg" if fmt == "jpg" else fmt


# ---------------------------------------------------------------- chunk by chunk through the index


def _chunk_summary(f: IO[bytes], path: Path) -> Summary | None:
    """The summary, if the file has one that indexes chunks and names channels, and whose CRC
    (when written) holds; else None, and the file is read in one pass."""
    try:
        size = f.seek(0, io.SEEK_END)
        f.seek(size - FOOTER_SIZE - MAGIC_SIZE)
        footer = next(StreamReader(f, skip_magic=True, record_size_limit=_RECORD_SIZE_LIMIT).records)
        if not isinstance(footer, Footer) or not 0 < footer.summary_start < size:
            return None
        if footer.summary_crc != 0:
            # The CRC covers the summary and the footer up to the CRC field itself.
            f.seek(footer.summary_start)
            if zlib.crc32(f.read(size - MAGIC_SIZE - 4 - footer.summary_start)) != footer.summary_crc:
                log.warning("%s: summary CRC mismatch: reading the file in one pass", path.name)
                return None
        f.seek(0)
        summary = SeekingReader(f, record_size_limit=_RECORD_SIZE_LIMIT).get_summary()
    except Exception as exc:  # noqa: BLE001 - a cut or damaged end of file: no usable summary
        log.debug("%s: no usable summary (%s: %s)", path.name, type(exc).__name__, exc)
        return None
    # Without channels in the summary, a message's channel is only known from records that
    # may sit in a damaged chunk: one pass it is.
    if summary is None or not summary.chunk_indexes or not summary.channels:
        return None
    return summary


def _indexed_messages(
    f: IO[bytes], summary: Summary, reading: _Reading
) -> Iterator[tuple[Schema | None, Channel, Message]]:
    """(schema, channel, message) in file order, chunk by chunk; damaged chunks go to `reading`."""
    schemas = dict(summary.schemas)
    channels = dict(summary.channels)
    read_by_channel: Counter[int] = Counter()
    known_lost: Counter[int] = Counter()
    unindexed = False
    for index in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
        try:
            records = _chunk_records(f, index)
        except _DamagedChunk as damaged:
            by_channel = _indexed_counts(f, index)
            if by_channel is None:
                unindexed = True
            else:
                known_lost.update(by_channel)
            # Lost on a FrameTransform pose topic counts every transform, of any child frame.
            lost = None if by_channel is None else _by_topic(channels, by_channel)
            reading.lose_chunk(index.chunk_start_offset, str(damaged), lost)
            continue
        for record in records:
            if isinstance(record, Schema):
                schemas[record.id] = record
            elif isinstance(record, Channel):
                channels[record.id] = record
            elif isinstance(record, Message):
                channel = channels.get(record.channel_id)
                if channel is None:
                    raise McapError(f"no channel record found with id {record.channel_id}")
                if channel.schema_id != 0 and channel.schema_id not in schemas:
                    raise McapError(f"no schema record found with id {channel.schema_id}")
                read_by_channel[record.channel_id] += 1
                yield schemas.get(channel.schema_id), channel, record
    if unindexed:
        # Some damaged chunk has no message index. The summary statistics count every
        # channel's messages in the whole file: what the undamaged chunks did not hold was lost.
        stats = summary.statistics
        if stats is not None and stats.channel_message_counts:
            rest = Counter(
                {c: n - read_by_channel[c] - known_lost[c] for c, n in stats.channel_message_counts.items()}
            )
            reading.unindexed_lost = _by_topic(channels, +rest)  # unary +: positive counts only


class _DamagedChunk(Exception):
    pass


def _chunk_records(f: IO[bytes], index: ChunkIndex) -> list:
    """All records of one chunk, after checking its framing, decompression and CRC (when the
    writer wrote one): a damaged chunk yields nothing rather than a part of its messages."""
    f.seek(index.chunk_start_offset)
    raw = f.read(index.chunk_length)
    if len(raw) != index.chunk_length:
        raise _DamagedChunk("cut short")
    stream = ReadDataStream(io.BytesIO(raw))
    opcode, length = stream.read1(), stream.read8()
    if opcode != Opcode.CHUNK or length != index.chunk_length - 9:
        raise _DamagedChunk(f"not the chunk the index describes (opcode {opcode:#x}, length {length})")
    try:
        chunk = Chunk.read(stream)
        if len(chunk.data) != index.compressed_size or chunk.compression != index.compression:
            raise _DamagedChunk("chunk header differs from its index")
        return breakup_chunk(chunk, validate_crc=True)
    except _DamagedChunk:
        raise
    except CRCValidationError as exc:
        raise _DamagedChunk("CRC mismatch") from exc
    except Exception as exc:  # noqa: BLE001 - bytes that do not decompress or parse
        raise _DamagedChunk(f"cannot decompress or parse ({type(exc).__name__}: {exc})") from exc


def _indexed_counts(f: IO[bytes], index: ChunkIndex) -> Counter[int] | None:
    """Messages per channel id in a chunk, from its message index records, or None if it has
    none or they are unreadable.

    The message index records follow the chunk record in the file, outside its (possibly
    garbage) compressed bytes, and list one entry per message: they count exactly what a
    damaged chunk held even when not one of its records can be parsed.
    """
    if not index.message_index_offsets:
        return None
    start = index.chunk_start_offset + index.chunk_length
    counts: Counter[int] = Counter()
    try:
        for channel_id, offset in index.message_index_offsets.items():
            if not start <= offset < start + index.message_index_length:
                return None
            f.seek(offset)
            record = next(StreamReader(f, skip_magic=True, record_size_limit=_RECORD_SIZE_LIMIT).records)
            if not isinstance(record, MessageIndex) or record.channel_id != channel_id:
                return None
            counts[channel_id] = len(record.records)
    except Exception:  # noqa: BLE001 - damaged index: counts unknown
        return None
    return counts


def _by_topic(channels: dict[int, Channel], by_channel: Counter[int]) -> Counter[str]:
    """Counts per channel id -> per topic (two channels may share a topic)."""
    out: Counter[str] = Counter()
    for channel_id, n in by_channel.items():
        channel = channels.get(channel_id)
        out[channel.topic if channel is not None else f"<channel {channel_id}>"] += n
    return out
