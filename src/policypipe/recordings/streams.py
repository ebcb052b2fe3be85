"""Reading the streams of a `_vio.mcap` that a dataset needs: camera, pose, gripper width.

One pass over the file in file order (`NonSeekingReader`): it works with or without a summary
and index, with any chunk compression, and on a truncated file it yields what was readable
before the damage. Capture times come from inside the messages (`timestamp`, `stamp_ns`),
never from MCAP `log_time`, and stay integer nanoseconds.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from mcap.reader import NonSeekingReader

log = logging.getLogger(__name__)

IMAGE_SCHEMA = "foxglove.CompressedImage"
VIDEO_SCHEMA = "foxglove.CompressedVideo"
POSE_SCHEMA = "foxglove.PoseInFrame"
TRANSFORM_SCHEMA = "foxglove.FrameTransform"


class RecordingError(Exception):
    """A recording that cannot become an episode; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Topics:
    """`convert.topics` in params.yaml: which stream feeds which key (recording-format.md)."""

    camera: str = "/camera0/image"  # foxglove.CompressedImage or foxglove.CompressedVideo
    pose: str = "/vio/pose"
    width: str = "/gripper/width"
    # For a `foxglove.FrameTransform` pose topic: the child frame that is the gripper.
    pose_child_frame: str | None = None
    width_stamp_field: str = "stamp_ns"
    width_value_field: str = "width_m"


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


def _stamp_ns(ts) -> int:
    return int(ts.seconds) * 1_000_000_000 + int(ts.nanos)


def read_streams(path: Path, topics: Topics) -> Streams:
    camera_ns: list[int] = []
    camera_data: list[bytes] = []
    formats: set[str] = set()
    pose_ns: list[int] = []
    pose: list[tuple[float, ...]] = []
    width_ns: list[int] = []
    width: list[float] = []
    seen: dict[str, str] = {}  # topic -> schema name, for messages about missing topics
    truncated: str | None = None
    wanted = {topics.camera, topics.pose, topics.width}

    with open(path, "rb") as f:
        reader = NonSeekingReader(f, record_size_limit=1 << 30)
        try:
            for schema, channel, message in reader.iter_messages(log_time_order=False):
                schema_name = schema.name if schema is not None else ""
                seen.setdefault(channel.topic, schema_name)
                if channel.topic not in wanted:
                    continue
                if channel.topic == topics.camera:
                    if schema_name == IMAGE_SCHEMA:
                        msg = CompressedImage.FromString(message.data)
                    elif schema_name == VIDEO_SCHEMA:
                        msg = CompressedVideo.FromString(message.data)
                    else:
                        raise _wrong_schema(channel.topic, schema_name, f"{IMAGE_SCHEMA} or {VIDEO_SCHEMA}")
                    camera_ns.append(_stamp_ns(msg.timestamp))
                    camera_data.append(msg.data)
                    formats.add(msg.format.lower())
                elif channel.topic == topics.pose:
                    sample = _read_pose(schema_name, message.data, topics, channel.topic)
                    if sample is not None:
                        pose_ns.append(sample[0])
                        pose.append(sample[1])
                else:
                    if channel.message_encoding != "json":
                        raise _wrong_schema(channel.topic, f"{schema_name} ({channel.message_encoding})", "a JSON channel")
                    stamp, value = _read_width(message.data, topics)
                    width_ns.append(stamp)
                    width.append(value)
        except RecordingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoding failure past this point is damage to the file
            truncated = f"reading stopped after {len(camera_ns)} camera frames: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", path.name, truncated)

    for topic, what in ((topics.camera, camera_ns), (topics.pose, pose_ns), (topics.width, width_ns)):
        if not what:
            present = ", ".join(f"{t} ({s or 'no schema'})" for t, s in sorted(seen.items())) or "none"
            detail = " before the file was cut" if truncated else ""
            raise RecordingError("missing_topic", f"no messages on {topic}{detail}; topics present: {present}")
    pose_arr = np.asarray(pose, dtype=np.float64).reshape(-1, 7)
    return Streams(
        camera_ns=np.asarray(camera_ns, dtype=np.int64),
        camera_data=camera_data,
        camera_format=_single_format(formats, topics.camera),
        pose_ns=np.asarray(pose_ns, dtype=np.int64),
        position=pose_arr[:, :3],
        quaternion=pose_arr[:, 3:],
        width_ns=np.asarray(width_ns, dtype=np.int64),
        width=np.asarray(width, dtype=np.float64),
        truncated=truncated,
    )


def _read_pose(schema_name: str, data: bytes, topics: Topics, topic: str) -> tuple[int, tuple[float, ...]] | None:
    """(capture ns, (x, y, z, qx, qy, qz, qw)), or None for a transform of another frame."""
    if schema_name == POSE_SCHEMA:
        msg = PoseInFrame.FromString(data)
        p, q = msg.pose.position, msg.pose.orientation
    elif schema_name == TRANSFORM_SCHEMA:
        msg = FrameTransform.FromString(data)
        if topics.pose_child_frame is not None and msg.child_frame_id != topics.pose_child_frame:
            return None
        p, q = msg.translation, msg.rotation
    else:
        raise _wrong_schema(topic, schema_name, f"{POSE_SCHEMA} or {TRANSFORM_SCHEMA}")
    return _stamp_ns(msg.timestamp), (p.x, p.y, p.z, q.x, q.y, q.z, q.w)


def _read_width(data: bytes, topics: Topics) -> tuple[int, float]:
    try:
        obj = json.loads(data)
        return int(obj[topics.width_stamp_field]), float(obj[topics.width_value_field])
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordingError(
            "bad_width_message",
            f"{topics.width} message {data[:80]!r} lacks {topics.width_stamp_field!r}/{topics.width_value_field!r}: {exc}",
        ) from exc


def _wrong_schema(topic: str, got: str, expected: str) -> RecordingError:
    return RecordingError("unexpected_schema", f"{topic} has schema {got or 'none'!r}, expected {expected}")


def _single_format(formats: set[str], topic: str) -> str:
    if len(formats) != 1:
        raise RecordingError("mixed_camera_formats", f"{topic} mixes frame formats {sorted(formats)}")
    (fmt,) = formats
    if fmt not in ("jpeg", "jpg", "png", "h264"):
        raise RecordingError("unsupported_camera_format", f"{topic} frames are {fmt!r}; supported: jpeg, png, h264")
    return "jpeg" if fmt == "jpg" else fmt
