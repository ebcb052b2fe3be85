"""Reading the streams of a `_vio.mcap` that a dataset needs: camera, pose, gripper width.

Messages are read in file order, one of two ways:

- The file has a summary section with chunk indexes (an indexed writer that finished): chunk by
  chunk through the indexes. Each chunk's decompression and CRC are checked; a damaged chunk is
  skipped, its messages are counted as lost (`Streams.lost`, `Streams.damage`) and reading goes
  on with the next chunk.
- Otherwise (a writer that crashed leaves no summary; a writer that never indexes): record by
  record from the start, with or without chunks, any chunk compression. A damaged chunk is
  skipped the same way; its messages are counted if message index records follow it, else its
  damage line gives what is known (its bytes, the log times its header gives). A damaged record
  length is stepped over to the next chunk that checks out. A cut file keeps what was readable
  before the cut (`Streams.truncated`).

One bad message (bytes that are not the protobuf or JSON they should be, a capture time beyond
int64 nanoseconds) is skipped and counted as lost; it never stops reading. Capture times come
from inside the messages (`timestamp`, `stamp_ns`), never from MCAP `log_time`, and stay
integer nanoseconds.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from mcap.records import Channel, Message

from policypipe.recordings.mcap_chunks import (
    ChunkLosses,
    ReadingStopped,
    chunk_summary,
    indexed_messages,
    sequential_messages,
)
from policypipe.recordings.messages import (
    IMAGE_SCHEMA,
    VIDEO_SCHEMA,
    BadMessage,
    RecordingError,
    Topics,
    checked_stamp,
    parse_message,
    read_pose,
    read_width,
    single_format,
    wrong_schema,
)

log = logging.getLogger(__name__)

STREAM_NAMES = ("camera", "pose", "width")  # the keys of `Streams.lost`


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
        summary = chunk_summary(f, path)
        f.seek(0)
        if summary is None:
            messages = sequential_messages(f, reading.losses)
        else:
            messages = indexed_messages(f, summary, reading.losses)
        try:
            for schema, channel, message in messages:
                reading.add(schema.name if schema is not None else "", channel, message)
        except RecordingError:
            raise
        except ReadingStopped as exc:
            reading.stopped = str(exc)
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
        # ... or with their chunk (damaged chunks), or with their channel's record.
        self.losses = ChunkLosses()

    def add(self, schema_name: str, channel: Channel, message: Message) -> None:
        topic = channel.topic
        self.seen.setdefault(topic, schema_name)
        if topic in self.cameras:
            self._add_camera(self.cameras[topic], schema_name, topic, message.data)
        elif topic == self.topics.pose:
            self._add_pose(schema_name, topic, message.data)
        elif topic == self.topics.width:
            if channel.message_encoding != "json":
                raise wrong_schema(topic, f"{schema_name} ({channel.message_encoding})", "a JSON channel")
            try:
                stamp, value = read_width(message.data, self.topics)
            except BadMessage as exc:
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
            msg = parse_message(CompressedImage if schema_name == IMAGE_SCHEMA else CompressedVideo, data)
            stamp = checked_stamp(msg.timestamp)
        except BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        camera.ns.append(stamp)
        camera.data.append(msg.data)  # a zero-length frame stays: the decoder counts it as undecodable
        if msg.format:  # a message without a format (an empty one) says nothing about the others
            camera.formats.add(msg.format.lower())

    def _add_pose(self, schema_name: str, topic: str, data: bytes) -> None:
        try:
            sample = read_pose(schema_name, data, self.topics, topic)
        except BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        if sample is not None:
            self.pose_ns.append(sample[0])
            self.pose.append(sample[1])

    def _skip(self, topic: str, kind: str, detail: str) -> None:
        skipped = self.skipped.setdefault((topic, kind), _Skipped(0, detail))
        skipped.count += 1

    def _lost_by_topic(self) -> Counter[str]:
        lost: Counter[str] = Counter()
        for (topic, _), skipped in self.skipped.items():
            lost[topic] += skipped.count
        for chunk in self.losses.chunks:
            lost.update(chunk.lost or {})
        lost.update(self.losses.unindexed or {})
        lost.update(self.losses.unattributed)
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
            raise wrong_schema(camera_topic, camera.wrong_schema, f"{IMAGE_SCHEMA} or {VIDEO_SCHEMA}")
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
                elif damage:  # the damage may have cost them, uncounted
                    detail += f" (the file is damaged: {'; '.join(damage)})"
                raise RecordingError(
                    "missing_topic", f"no messages on {topic}{detail}; topics present: {present}"
                )

        pose_arr = np.asarray(self.pose, dtype=np.float64).reshape(-1, 7)
        return Streams(
            camera_ns=np.asarray(camera.ns, dtype=np.int64),
            camera_data=camera.data,
            camera_format=single_format(camera.formats, camera_topic),
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
        for chunk in self.losses.chunks:
            if chunk.lost is None:
                lines.append(f"{chunk.where}: {chunk.why}: lost messages not known ({chunk.unknown})")
            else:
                lines.append(f"{chunk.where}: {chunk.why}: lost {counts(chunk.lost)} messages")
        if self.losses.unindexed is not None:
            lines.append(
                f"chunks without message index: lost {counts(self.losses.unindexed)} messages "
                "(from the summary statistics)"
            )
        if self.losses.unattributed:
            lines.append(
                f"skipped {counts(self.losses.unattributed)} messages whose channel or schema record is "
                "missing (in a damaged chunk, or never written)"
            )
        for (topic, kind), skipped in self.skipped.items():
            name = name_of.get(topic, topic)
            lines.append(
                f"{name}: skipped {skipped.count} message(s) on {topic}: {kind} (first: {skipped.first})"
            )
        return lines
