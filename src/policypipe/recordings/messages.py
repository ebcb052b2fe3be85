"""One message's bytes -> the values a stream holds: camera frames (foxglove CompressedImage or
CompressedVideo), pose (PoseInFrame or FrameTransform) and width (a JSON channel). Capture times
come from inside the messages (`timestamp`, `stamp_ns`), never from MCAP `log_time`, and stay
integer nanoseconds. A message that cannot be read raises `BadMessage`: it is skipped and
counted, never fatal to the recording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from google.protobuf.message import DecodeError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

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

    # Version 2 (recording-format.md, section 3): gripper i's streams and camera k under fixed
    # names; the topics above are gripper 0's and camera 0's, and a file uses one naming or the other.

    def camera_candidates(self, k: int) -> tuple[str, ...]:
        """Camera k's topics, in order of preference."""
        return self.camera if k == 0 else (f"/camera{k}/image", f"/camera{k}/video")

    def pose_candidates(self, i: int) -> tuple[str, ...]:
        """Gripper i's pose topics, in order of preference."""
        v2 = f"/robot{i}/vio/pose"
        return tuple(dict.fromkeys((self.pose, v2))) if i == 0 else (v2,)

    def width_candidates(self, i: int) -> tuple[str, ...]:
        """Gripper i's width topics, in order of preference."""
        v2 = f"/robot{i}/gripper/width"
        return tuple(dict.fromkeys((self.width, v2))) if i == 0 else (v2,)


class BadMessage(Exception):
    """One message that cannot be read; reading goes on without it."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def parse_message(cls, data: bytes):
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise BadMessage(
            f"not a valid {cls.DESCRIPTOR.full_name}", f"{len(data)} bytes {data[:16]!r}: {exc}"
        ) from exc


def checked_stamp(ts) -> int:
    """Capture time in ns; it must fit in int64 (the arrays it goes into)."""
    ns = int(ts.seconds) * 1_000_000_000 + int(ts.nanos)
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise BadMessage("capture time beyond int64 nanoseconds", f"seconds={ts.seconds}, nanos={ts.nanos}")
    return ns


def read_pose(
    schema_name: str, data: bytes, topics: Topics, topic: str
) -> tuple[int, tuple[float, ...]] | None:
    """(capture ns, (x, y, z, qx, qy, qz, qw)), or None for a transform of another frame."""
    if schema_name == POSE_SCHEMA:
        msg = parse_message(PoseInFrame, data)
        p, q = msg.pose.position, msg.pose.orientation
    elif schema_name == TRANSFORM_SCHEMA:
        msg = parse_message(FrameTransform, data)
        if topics.pose_child_frame is not None and msg.child_frame_id != topics.pose_child_frame:
            return None
        p, q = msg.translation, msg.rotation
    else:
        raise wrong_schema(topic, schema_name, f"{POSE_SCHEMA} or {TRANSFORM_SCHEMA}")
    return checked_stamp(msg.timestamp), (p.x, p.y, p.z, q.x, q.y, q.z, q.w)


def read_width(data: bytes, topics: Topics) -> tuple[int, float]:
    try:
        obj = json.loads(data)
        stamp, value = int(obj[topics.width_stamp_field]), float(obj[topics.width_value_field])
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise BadMessage(
            f"malformed JSON or no {topics.width_stamp_field!r}/{topics.width_value_field!r}",
            f"{data[:80]!r}: {type(exc).__name__}: {exc}",
        ) from exc
    if not _INT64_MIN <= stamp <= _INT64_MAX:
        raise BadMessage(f"{topics.width_stamp_field} beyond int64 nanoseconds", f"{data[:80]!r}")
    return stamp, value


def wrong_schema(topic: str, got: str, expected: str) -> RecordingError:
    return RecordingError("unexpected_schema", f"{topic} has schema {got or 'none'!r}, expected {expected}")


def single_format(formats: set[str], topic: str) -> str:
    if len(formats) != 1:
        what = f"mixes frame formats {sorted(formats)}" if formats else "has no frame format"
        raise RecordingError("mixed_camera_formats", f"{topic} {what}")
    (fmt,) = formats
    if fmt not in ("jpeg", "jpg", "png", "h264"):
        raise RecordingError(
            "unsupported_camera_format", f"{topic} frames are {fmt!r}; supported: jpeg, png, h264"
        )
    return "jpeg" if fmt == "jpg" else fmt
