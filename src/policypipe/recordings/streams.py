"""Reading the streams of a `_vio.mcap` that a dataset needs: cameras, and each gripper's pose and
width (version 1 names or version 2's, recording-format.md).

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
from collections.abc import Iterator, Sequence
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


def stream_name(kind: str, index: int) -> str:
    """How reports name a stream: "camera", "pose" and "width" for camera 0 and gripper 0 (a version
    1 recording's only ones), "camera{k}", "robot{i}_pose" and "robot{i}_width" for the others."""
    if index == 0:
        return kind
    return f"camera{index}" if kind == "camera" else f"robot{index}_{kind}"


@dataclass
class CameraStream:
    topic: str  # which of the camera's candidate topics was used
    ns: np.ndarray  # int64 (M,), capture time of each message, file order
    # (M,) compressed frames; for "rgb", (H, W, 3) uint8 arrays (an HDF5 source's raw rows, read
    # when decoded: a sequence that reads its file row by row serves as well as a list). Decoding
    # iterates it in order, so a `FramesInFile` (read_streams' hold_frames=False) serves too.
    data: Sequence | FramesInFile
    # "jpeg" | "png" | "h264"; "rgb": raw rows; "jpeg_rgb": JPEG or PNG of RGB arrays encoded as if
    # BGR (OpenCV's imencode on an RGB array, as ACT's and RDT's HDF5 writers do)
    format: str


@dataclass
class GripperStreams:
    pose_topic: str
    width_topic: str
    pose_ns: np.ndarray  # int64 (P,)
    position: np.ndarray  # float64 (P, 3), metres
    quaternion: np.ndarray  # float64 (P, 4), x y z w as written (not yet validated)
    width_ns: np.ndarray  # int64 (W,)
    width: np.ndarray  # float64 (W,), metres


@dataclass
class Streams:
    """The streams of the grippers and cameras asked for. Every gripper's pose and width, and
    camera 0 (the dataset's clock), are required; another camera may be absent (`missing_cameras`)."""

    cameras: dict[int, CameraStream]
    grippers: dict[int, GripperStreams]
    truncated: str | None  # why reading stopped early, or None
    # `stream_name` -> messages lost, nonzero only
    lost: dict[str, int] = field(default_factory=dict)
    damage: list[str] = field(default_factory=list)  # one line per damaged chunk or kind of skipped message
    warnings: list[str] = field(default_factory=list)  # e.g. two candidate topics with messages
    missing_cameras: tuple[int, ...] = ()  # asked for, and without a single message in the file
    # Where camera k was looked for, when not in convert.topics (an HDF5 source's obs key).
    camera_sources: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of_one_gripper(
        cls,
        camera_ns: np.ndarray,
        camera_data: list[bytes],
        camera_format: str,
        pose_ns: np.ndarray,
        position: np.ndarray,
        quaternion: np.ndarray,
        width_ns: np.ndarray,
        width: np.ndarray,
        truncated: str | None,
        camera_topic: str = "",
        **rest,
    ) -> Streams:
        """The streams of a version 1 recording (one gripper, one camera), given as arrays."""
        return cls(
            cameras={0: CameraStream(camera_topic, camera_ns, camera_data, camera_format)},
            grippers={0: GripperStreams("", "", pose_ns, position, quaternion, width_ns, width)},
            truncated=truncated,
            **rest,
        )

    # Camera 0 and gripper 0: all of a version 1 recording.
    @property
    def camera_ns(self) -> np.ndarray:
        return self.cameras[0].ns

    @property
    def camera_data(self) -> list[bytes]:
        return self.cameras[0].data

    @property
    def camera_format(self) -> str:
        return self.cameras[0].format

    @property
    def camera_topic(self) -> str:
        return self.cameras[0].topic

    @property
    def pose_ns(self) -> np.ndarray:
        return self.grippers[0].pose_ns

    @property
    def position(self) -> np.ndarray:
        return self.grippers[0].position

    @property
    def quaternion(self) -> np.ndarray:
        return self.grippers[0].quaternion

    @property
    def width_ns(self) -> np.ndarray:
        return self.grippers[0].width_ns

    @property
    def width(self) -> np.ndarray:
        return self.grippers[0].width


def read_streams(
    path: Path,
    topics: Topics,
    grippers: tuple[int, ...] = (0,),
    cameras: tuple[int, ...] = (0,),
    hold_frames: bool = True,
) -> Streams:
    """The streams of `grippers` and `cameras` (camera 0 among them) in the `_vio.mcap` at `path`.

    `hold_frames` false: each camera's `data` is a `FramesInFile`, which reads the compressed
    frames from the file again, one at a time, when iterated: memory holds the capture times and
    the samples, never the frames (a long recording's are gigabytes)."""
    reading = _Reading(topics, grippers, cameras, hold_frames)
    messages = _file_messages(path, reading.losses)  # a file that cannot be opened raises here
    try:
        for schema_name, channel, message in messages:
            reading.add(schema_name, channel, message)
    except RecordingError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read records past this point is damage to the file
        reading.stopped = _why_stopped(exc)
    streams = reading.finish(path)
    if not hold_frames:
        for camera in streams.cameras.values():
            camera.data = FramesInFile(path, camera.topic, len(camera.ns))
    return streams


def _file_messages(path: Path, losses: ChunkLosses) -> Iterator[tuple[str, Channel, Message]]:
    """(schema name, channel, message) of every message in file order; damaged chunks to `losses`.
    The file is opened now, so that an error opening it is raised by this call, not as damage."""
    f = open(path, "rb")  # closed by the generator below, or here if the summary fails
    try:
        summary = chunk_summary(f, path)
        f.seek(0)
    except BaseException:
        f.close()
        raise

    def messages() -> Iterator[tuple[str, Channel, Message]]:
        with f:
            records = (
                sequential_messages(f, losses) if summary is None else indexed_messages(f, summary, losses)
            )
            for schema, channel, message in records:
                yield (schema.name if schema is not None else ""), channel, message

    return messages()


def _why_stopped(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ReadingStopped) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class FramesInFile:
    """A camera topic's compressed frames, read from the file when iterated, in file order, one at
    a time: the frames `read_streams` would have held, by the same reading (the same damaged chunks
    skipped, the same bad messages left out), so frame i is the one captured at the stream's ns[i]."""

    path: Path
    topic: str
    count: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[bytes]:
        read = 0
        messages = _file_messages(self.path, ChunkLosses())
        try:
            for schema_name, channel, message in messages:
                if read == self.count:
                    return
                if channel.topic != self.topic or schema_name not in (IMAGE_SCHEMA, VIDEO_SCHEMA):
                    continue
                try:
                    _, data, _ = camera_frame(schema_name, message.data)
                except BadMessage:
                    continue
                read += 1
                yield data
        except Exception as exc:  # noqa: BLE001 - as read_streams: where the first reading stopped too
            stopped = _why_stopped(exc)
        else:
            stopped = "the end of the file"
        if read != self.count:
            raise RecordingError(
                "changed_while_read",
                f"{self.path}: {read} frames on {self.topic} on a second reading, {self.count} on the "
                f"first (stopped at {stopped}): was the file written to meanwhile?",
            )


def camera_frame(schema_name: str, data: bytes) -> tuple[int, bytes, str]:
    """A CompressedImage's or CompressedVideo's capture time, frame bytes and format; BadMessage
    for bytes that are not the message or a capture time beyond int64 nanoseconds."""
    msg = parse_message(CompressedImage if schema_name == IMAGE_SCHEMA else CompressedVideo, data)
    return checked_stamp(msg.timestamp), msg.data, msg.format


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
class _Samples:
    """What one pose or width candidate topic holds."""

    ns: list[int] = field(default_factory=list)
    values: list = field(default_factory=list)
    messages: int = 0


@dataclass
class _Skipped:
    count: int
    first: str


class _Reading:
    """Collects messages in file order into streams, and everything lost on the way."""

    def __init__(
        self, topics: Topics, grippers: tuple[int, ...], cameras: tuple[int, ...], hold_frames: bool = True
    ) -> None:
        if 0 not in cameras:
            raise ValueError(f"cameras={list(cameras)}: camera 0 is the dataset's clock and must be read")
        self.topics = topics
        self.grippers = grippers
        self.hold_frames = hold_frames
        # (kind, number) -> its candidate topics, in order of preference
        self.candidates: dict[tuple[str, int], tuple[str, ...]] = {
            **{("camera", k): topics.camera_candidates(k) for k in cameras},
            **{("pose", i): topics.pose_candidates(i) for i in grippers},
            **{("width", i): topics.width_candidates(i) for i in grippers},
        }
        self.cameras: dict[str, _Camera] = {
            t: _Camera() for (kind, _), ts in self.candidates.items() if kind == "camera" for t in ts
        }
        self.samples: dict[str, _Samples] = {
            t: _Samples() for (kind, _), ts in self.candidates.items() if kind != "camera" for t in ts
        }
        self.kind_of: dict[str, str] = {}  # topic -> what it feeds; a topic listed twice feeds the first
        for (kind, _), ts in self.candidates.items():
            for t in ts:
                self.kind_of.setdefault(t, kind)
        self.seen: dict[str, str] = {}  # topic -> schema name, for messages about missing topics
        self.stopped: str | None = None  # why reading stopped early
        # Lost messages by topic (the candidate topic is chosen at the end): skipped one by one...
        self.skipped: dict[tuple[str, str], _Skipped] = {}  # (topic, what was wrong) -> count, first example
        # ... or with their chunk (damaged chunks), or with their channel's record.
        self.losses = ChunkLosses()

    def add(self, schema_name: str, channel: Channel, message: Message) -> None:
        topic = channel.topic
        self.seen.setdefault(topic, schema_name)
        kind = self.kind_of.get(topic)
        if kind == "camera":
            self._add_camera(self.cameras[topic], schema_name, topic, message.data)
        elif kind == "pose":
            self.samples[topic].messages += 1
            self._add_pose(schema_name, topic, message.data)
        elif kind == "width":
            self.samples[topic].messages += 1
            if channel.message_encoding != "json":
                raise wrong_schema(topic, f"{schema_name} ({channel.message_encoding})", "a JSON channel")
            try:
                stamp, value = read_width(message.data, self.topics)
            except BadMessage as exc:
                self._skip(topic, exc.kind, exc.detail)
                return
            self.samples[topic].ns.append(stamp)
            self.samples[topic].values.append(value)

    def _add_camera(self, camera: _Camera, schema_name: str, topic: str, data: bytes) -> None:
        camera.messages += 1
        if schema_name not in (IMAGE_SCHEMA, VIDEO_SCHEMA):
            # Raised only if this candidate is the one used: another may have the frames.
            camera.wrong_schema = camera.wrong_schema or schema_name
            return
        try:
            stamp, frame, image_format = camera_frame(schema_name, data)
        except BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        camera.ns.append(stamp)
        if self.hold_frames:
            camera.data.append(frame)  # a zero-length frame stays: the decoder counts it as undecodable
        if image_format:  # a message without a format (an empty one) says nothing about the others
            camera.formats.add(image_format.lower())

    def _add_pose(self, schema_name: str, topic: str, data: bytes) -> None:
        try:
            sample = read_pose(schema_name, data, self.topics, topic)
        except BadMessage as exc:
            self._skip(topic, exc.kind, exc.detail)
            return
        if sample is not None:
            self.samples[topic].ns.append(sample[0])
            self.samples[topic].values.append(sample[1])

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

    def _messages(self, topic: str) -> int:
        holder = self.cameras.get(topic) or self.samples[topic]
        return holder.messages

    def finish(self, path: Path) -> Streams:
        lost_by_topic = self._lost_by_topic()
        chosen: dict[tuple[str, int], str] = {}
        warnings: list[str] = []
        for (kind, index), candidates in self.candidates.items():
            chosen[(kind, index)], warning = self._choose(stream_name(kind, index), candidates, lost_by_topic)
            warnings.extend(warning)
        # A camera beyond camera 0 without a single readable frame (none written, or every one lost
        # to damage or unreadable) is missing from the recording, for convert.on_missing_camera.
        missing_cameras = tuple(
            k
            for (kind, k), topic in chosen.items()
            if kind == "camera" and k != 0 and not self.cameras[topic].ns
        )
        stream_topic = {  # what the report counts losses of: every stream the file has
            stream_name(kind, index): topic
            for (kind, index), topic in chosen.items()
            if kind != "camera" or index == 0 or self._present(topic, lost_by_topic)
        }
        lost = {name: lost_by_topic[t] for name, t in stream_topic.items() if lost_by_topic[t]}
        damage = self._damage_lines(stream_topic)
        truncated = None
        if self.stopped is not None:
            frames = len(self.cameras[chosen[("camera", 0)]].ns)
            truncated = f"reading stopped after {frames} camera frames: {self.stopped}"
            log.warning("%s: %s", path.name, truncated)
        for line in [*damage, *warnings]:
            log.warning("%s: %s", path.name, line)

        for (kind, _), topic in chosen.items():
            camera = self.cameras.get(topic)
            if kind == "camera" and camera.messages and camera.wrong_schema is not None:
                raise wrong_schema(topic, camera.wrong_schema, f"{IMAGE_SCHEMA} or {VIDEO_SCHEMA}")
        for (kind, _), topic in chosen.items():
            bad = sum(s.count for (t, _), s in self.skipped.items() if t == topic)
            if kind == "width" and not self.samples[topic].ns and bad:
                first = next(s.first for (t, _), s in self.skipped.items() if t == topic)
                raise RecordingError(
                    "bad_width_message",
                    f"all {bad} messages on {topic} are unreadable or lack "
                    f"{self.topics.width_stamp_field!r}/{self.topics.width_value_field!r}; first: {first}",
                )
        for (kind, index), topic in chosen.items():
            holder = self.cameras[topic] if kind == "camera" else self.samples[topic]
            if holder.ns or (kind == "camera" and index in missing_cameras):
                continue
            name = stream_name(kind, index)
            candidates = self.candidates[(kind, index)]
            shown = topic if self._present(topic, lost_by_topic) else " or ".join(candidates)
            present = ", ".join(f"{t} ({s or 'no schema'})" for t, s in sorted(self.seen.items())) or "none"
            detail = " before the file was cut" if truncated else ""
            if lost.get(name):
                detail += f" ({lost[name]} lost: {'; '.join(damage)})"
            elif damage:  # the damage may have cost them, uncounted
                detail += f" (the file is damaged: {'; '.join(damage)})"
            if kind != "camera" and index > 0:  # a gripper the params ask for, not the file's
                detail += f" (convert.grippers {list(self.grippers)} asks for gripper {index})"
                if not any(t.startswith("/robot") for t in self.seen):
                    detail += (
                        "; this is a recording of one gripper (format 1): convert it with "
                        "convert.grippers: [0], apart from the recordings of several"
                    )
            raise RecordingError(
                "missing_topic", f"no messages on {shown}{detail}; topics present: {present}"
            )

        cameras = {}
        for (kind, k), topic in chosen.items():
            if kind == "camera" and k not in missing_cameras:
                camera = self.cameras[topic]
                cameras[k] = CameraStream(
                    topic=topic,
                    ns=np.asarray(camera.ns, dtype=np.int64),
                    data=camera.data,
                    format=single_format(camera.formats, topic),
                )
        grippers = {}
        for (kind, i), pose_topic in chosen.items():
            if kind != "pose":
                continue
            pose, width = self.samples[pose_topic], self.samples[chosen[("width", i)]]
            pose_arr = np.asarray(pose.values, dtype=np.float64).reshape(-1, 7)
            grippers[i] = GripperStreams(
                pose_topic=pose_topic,
                width_topic=chosen[("width", i)],
                pose_ns=np.asarray(pose.ns, dtype=np.int64),
                position=pose_arr[:, :3],
                quaternion=pose_arr[:, 3:],
                width_ns=np.asarray(width.ns, dtype=np.int64),
                width=np.asarray(width.values, dtype=np.float64),
            )
        return Streams(
            cameras=dict(sorted(cameras.items())),
            grippers=dict(sorted(grippers.items())),
            truncated=truncated,
            lost=lost,
            damage=damage,
            warnings=warnings,
            missing_cameras=missing_cameras,
        )

    def _present(self, topic: str, lost_by_topic: Counter[str]) -> bool:
        return bool(self._messages(topic) or lost_by_topic[topic])

    def _choose(
        self, name: str, candidates: tuple[str, ...], lost_by_topic: Counter[str]
    ) -> tuple[str, list[str]]:
        """The first candidate with messages in the file (read or lost), else the first one."""
        present = [t for t in candidates if self._present(t, lost_by_topic)]
        if not present:
            return candidates[0], []
        warnings = []
        if len(present) > 1:
            others = ", ".join(f"{t} ({self._messages(t)} messages)" for t in present[1:])
            warnings.append(
                f"{name}: more than one candidate topic has messages; used {present[0]}, ignored {others}"
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
