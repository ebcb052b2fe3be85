"""One synthetic recording as the studio writes it (shared/recording-format.md): a `_vio.mcap` with
camera, pose and width, and a raw MCAP, from a `MotionPlan` and a `StreamTiming`.

`simulate_recording` samples the streams (rates, jitter, dropped frames, log-time lag, messages out
of order); `write_vio_mcap` / `write_raw_mcap` write them with any of the format variations the
pipeline must accept, and return what was actually written (`RecordingTruth`). The bytes are a pure
function of the arguments: no wall clock, fixed encoder threads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from mcap.writer import CompressionType, IndexType, Writer
from mcap_protobuf.schema import build_file_descriptor_set

from policypipe.h264 import x264_params
from policypipe.synthetic.motion import MotionPlan
from policypipe.synthetic.render import render_frames_bgr, table_texture

# --- what the studio writes (recording-format.md, section 2) --------------------------------

IMAGE_TOPIC = "/camera0/image"
VIDEO_TOPIC = "/camera0/video"
POSE_TOPIC = "/vio/pose"
WIDTH_TOPIC = "/gripper/width"
IMU_TOPIC = "/imu"
DIAGNOSTICS_TOPIC = "/diagnostics"
CAMERA_FRAME_ID = "camera0"
WORLD_FRAME_ID = "world"
STUDIO_VERSION = "2.4.1"
MCAP_LIBRARY = (
    f"matrix-studio/{STUDIO_VERSION}"  # fixed: the mcap package version must not leak into the bytes
)
CHUNK_SIZE = 256 * 1024
JPEG_QUALITY = 80
H264_CRF = 23
VIO_H264_PRESET = "veryfast"
RAW_H264_PRESET = "ultrafast"  # like a camera's hardware encoder: fast, larger
KEYFRAME_INTERVAL_S = 1.0


@dataclass(frozen=True)
class StreamTiming:
    """How the streams of one recording were sampled and logged: rates, jitter, dropped
    camera frames, when each stream starts and stops relative to the motion plan, and how
    MCAP log_time differs from capture time."""

    camera_hz: float = 30.0
    camera_jitter_s: float = 0.001  # std of the exposure time around the nominal frame clock
    camera_drop_fraction: float = 0.02
    pose_hz: float = 150.0
    pose_jitter_s: float = 0.0002
    width_hz: float = 45.0
    width_jitter_s: float = 0.001
    imu_hz: float = 200.0  # raw recording only
    diagnostics_hz: float = 0.0  # 0: no /diagnostics channel
    # Seconds after the plan's start each stream's first sample is taken, and before the
    # plan's end its last one: the streams start and stop at different moments.
    camera_start_s: float = 0.0
    camera_stop_s: float = 0.0
    pose_start_s: float = 0.0
    pose_stop_s: float = 0.0
    width_start_s: float = 0.0
    width_stop_s: float = 0.0
    # log_time = capture time + a lag that drifts slowly within this range, per stream.
    log_lag_min_s: float = 0.002
    log_lag_max_s: float = 0.030
    out_of_order_fraction: float = 0.005  # messages swapped with their neighbour in the file

    def __post_init__(self) -> None:
        for name in ("camera_hz", "pose_hz", "width_hz", "imu_hz"):
            if not 1.0 <= getattr(self, name) <= 2000.0:
                raise ValueError(f"{name}={getattr(self, name)}: use a rate from 1 to 2000 Hz")
        if not 0.0 <= self.diagnostics_hz <= 100.0:
            raise ValueError(f"diagnostics_hz={self.diagnostics_hz}: use 0 (none) to 100 Hz")
        # Capture times must stay strictly increasing: jitter is clipped to 3 std, which has
        # to stay below half a sample interval.
        for hz, jitter in (
            ("camera", self.camera_jitter_s),
            ("pose", self.pose_jitter_s),
            ("width", self.width_jitter_s),
        ):
            rate = getattr(self, f"{hz}_hz")
            if not 0.0 <= 3.0 * jitter < 0.5 / rate:
                raise ValueError(
                    f"{hz}_jitter_s={jitter}: keep it below 1/6 of the sample interval ({1 / 6 / rate:.4g} s)"
                )
        if not 0.0 <= self.camera_drop_fraction < 0.5:
            raise ValueError(
                f"camera_drop_fraction={self.camera_drop_fraction}: use a fraction from 0 to 0.5"
            )
        for name in (
            "camera_start_s",
            "camera_stop_s",
            "pose_start_s",
            "pose_stop_s",
            "width_start_s",
            "width_stop_s",
        ):
            if not 0.0 <= getattr(self, name) <= 60.0:
                raise ValueError(f"{name}={getattr(self, name)}: use 0 to 60 seconds")
        if not 0.0 <= self.log_lag_min_s <= self.log_lag_max_s <= 10.0:
            raise ValueError("log lag: need 0 <= log_lag_min_s <= log_lag_max_s <= 10 s")
        if not 0.0 <= self.out_of_order_fraction <= 0.5:
            raise ValueError(
                f"out_of_order_fraction={self.out_of_order_fraction}: use a fraction from 0 to 0.5"
            )


def random_timing(rng: np.random.Generator, *, diagnostics: bool | None = None) -> StreamTiming:
    """Timing like a real recording's: pose at 120-200 Hz, width at ~45 Hz, camera at ~30 Hz
    with ~1 ms jitter and ~2% dropped frames; streams start and stop up to 0.3 s apart."""
    offsets = rng.uniform(0.0, 0.3, size=6)
    if diagnostics is None:
        diagnostics = bool(rng.random() < 1.0 / 3.0)
    return StreamTiming(
        camera_hz=30.0,
        camera_jitter_s=float(rng.uniform(0.0006, 0.0012)),
        camera_drop_fraction=float(rng.uniform(0.01, 0.03)),
        pose_hz=float(rng.choice([120.0, 150.0, 180.0, 200.0])),
        width_hz=float(rng.uniform(42.0, 48.0)),
        camera_start_s=float(offsets[0]),
        camera_stop_s=float(offsets[1]),
        pose_start_s=float(offsets[2]),
        pose_stop_s=float(offsets[3]),
        width_start_s=float(offsets[4]),
        width_stop_s=float(offsets[5]),
        log_lag_min_s=float(rng.uniform(0.001, 0.005)),
        log_lag_max_s=float(rng.uniform(0.015, 0.040)),
        diagnostics_hz=1.0 if diagnostics else 0.0,
    )


# --- one recording -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RecordingTruth:
    """What a recording actually contains (capture times, int64 ns, strictly increasing)."""

    camera: str  # "image" | "video"
    camera_ns: np.ndarray  # (F,) capture times of the frames written
    dropped_frames: int  # frames of the nominal clock that were not written
    pose_ns: np.ndarray  # (P,)
    width_ns: np.ndarray  # (W,)

    @property
    def frames(self) -> int:
        return len(self.camera_ns)

    @property
    def last_frame_ns(self) -> int:
        return int(self.camera_ns[-1])


@dataclass(frozen=True)
class _Channel:
    topic: str
    schema_name: str
    schema_encoding: str  # "protobuf" | "jsonschema"
    schema_data: bytes
    message_encoding: str  # "protobuf" | "json"


@dataclass(frozen=True)
class _Message:
    channel: str  # key into _CHANNELS
    log_ns: int
    data: bytes


def _json_schema(title: str, properties: dict) -> bytes:
    schema = {"title": title, "type": "object", "properties": properties, "required": list(properties)}
    return json.dumps(schema, separators=(",", ":")).encode()


_CHANNELS: dict[str, _Channel] = {
    "image": _Channel(
        IMAGE_TOPIC,
        CompressedImage.DESCRIPTOR.full_name,
        "protobuf",
        build_file_descriptor_set(CompressedImage).SerializeToString(deterministic=True),
        "protobuf",
    ),
    "video": _Channel(
        VIDEO_TOPIC,
        CompressedVideo.DESCRIPTOR.full_name,
        "protobuf",
        build_file_descriptor_set(CompressedVideo).SerializeToString(deterministic=True),
        "protobuf",
    ),
    "pose": _Channel(
        POSE_TOPIC,
        PoseInFrame.DESCRIPTOR.full_name,
        "protobuf",
        build_file_descriptor_set(PoseInFrame).SerializeToString(deterministic=True),
        "protobuf",
    ),
    "width": _Channel(
        WIDTH_TOPIC,
        "GripperWidth",
        "jsonschema",
        _json_schema("GripperWidth", {"stamp_ns": {"type": "integer"}, "width_m": {"type": "number"}}),
        "json",
    ),
    "diagnostics": _Channel(
        DIAGNOSTICS_TOPIC,
        "StudioDiagnostics",
        "jsonschema",
        _json_schema(
            "StudioDiagnostics",
            {
                "stamp_ns": {"type": "integer"},
                "level": {"type": "string"},
                "tracked_features": {"type": "integer"},
            },
        ),
        "json",
    ),
    "imu": _Channel(
        IMU_TOPIC,
        "Imu",
        "jsonschema",
        _json_schema(
            "Imu",
            {
                "stamp_ns": {"type": "integer"},
                "accel_mps2": {"type": "array", "items": {"type": "number"}},
                "gyro_radps": {"type": "array", "items": {"type": "number"}},
            },
        ),
        "json",
    ),
}


def _channel(key: str) -> _Channel:
    """A message's channel: one of `_CHANNELS`, or a version 2 topic (`/robot{i}/vio/pose`,
    `/robot{i}/gripper/width`, `/camera{k}/image`), which has the schema its last part names."""
    if key in _CHANNELS:
        return _CHANNELS[key]
    return replace(_CHANNELS[key.rsplit("/", 1)[-1]], topic=key)


@dataclass(frozen=True, eq=False)
class SimulatedRecording:
    """One recording, sampled and encoded, ready to be written as raw and as VIO MCAP."""

    plan: MotionPlan
    timing: StreamTiming
    truth: RecordingTruth
    vio_messages: tuple[_Message, ...]  # in file order (log_time order with a few swaps)
    raw_messages: tuple[_Message, ...]  # in log_time order


def sample_clock(
    rng: np.random.Generator, start_ns: int, stop_ns: int, hz: float, jitter_s: float
) -> np.ndarray:
    """(N,) int64 strictly increasing sample times: a nominal clock plus clipped jitter."""
    period_ns = 1e9 / hz
    n = int((stop_ns - start_ns) // period_ns) + 1
    jitter = np.clip(rng.normal(0.0, jitter_s, size=n), -3.0 * jitter_s, 3.0 * jitter_s) * 1e9
    t = start_ns + np.round(np.arange(n) * period_ns + jitter).astype(np.int64)
    # Jitter never moves a sample out of the stream's span (nor past a neighbour: < period/6).
    return np.clip(t, start_ns, stop_ns)


def camera_clock(
    rng: np.random.Generator, span: tuple[int, int], hz: float, jitter_s: float, drop_fraction: float
) -> tuple[np.ndarray, int]:
    """The capture times of the frames a camera wrote over `span` (ns), and how many of its
    nominal clock's frames it dropped; the first and last exposure define the span: never dropped."""
    nominal = sample_clock(rng, *span, hz, jitter_s)
    kept = rng.random(len(nominal)) >= drop_fraction
    kept[[0, -1]] = True
    return nominal[kept], int((~kept).sum())


def _log_times(rng: np.random.Generator, capture_ns: np.ndarray, timing: StreamTiming) -> np.ndarray:
    """(N,) int64 log times: capture time plus a lag that drifts slowly (a logger under
    varying load) and a little per-message noise."""
    if len(capture_ns) == 0:
        return capture_ns.copy()
    t_s = (capture_ns - capture_ns[0]).astype(np.float64) / 1e9
    period_s = rng.uniform(2.0, 6.0)
    phase = rng.uniform(0.0, 2.0 * np.pi)
    mid = (timing.log_lag_min_s + timing.log_lag_max_s) / 2.0
    half = (timing.log_lag_max_s - timing.log_lag_min_s) / 2.0
    lag_s = (
        mid
        + half * 0.8 * np.sin(2.0 * np.pi * t_s / period_s + phase)
        + rng.uniform(-0.1, 0.1, len(t_s)) * half
    )
    log_ns = capture_ns + np.round(lag_s * 1e9).astype(np.int64)
    # One stream is logged in its own order: strictly increasing, whatever the noise did.
    step = np.arange(len(log_ns), dtype=np.int64)
    return np.maximum.accumulate(log_ns - step) + step


def _pose_message(t_ns: int, position: np.ndarray, quat: np.ndarray) -> bytes:
    msg = PoseInFrame()
    msg.timestamp.FromNanoseconds(int(t_ns))
    msg.frame_id = WORLD_FRAME_ID
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in position)
    o = msg.pose.orientation
    o.x, o.y, o.z, o.w = (float(v) for v in quat)
    return msg.SerializeToString(deterministic=True)


def _json_message(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _encode_image(bgr: np.ndarray, image_format: str) -> bytes:
    import cv2

    if image_format == "jpeg":
        return cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1].tobytes()
    return cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])[1].tobytes()


class _H264Encoder:
    """H.264 Annex B, one access unit per frame: no B-frames and no lookahead (zerolatency),
    so every frame comes out of the encoder as one packet at once; an IDR with SPS/PPS every
    ~1 s; the settings of policypipe.h264, so the bitstream is the same on every run."""

    def __init__(self, image_size: tuple[int, int], hz: float, preset: str) -> None:
        import av

        keyint = max(1, int(round(KEYFRAME_INTERVAL_S * hz)))
        self._ctx = ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height = image_size
        ctx.pix_fmt = "yuv420p"
        ctx.time_base = Fraction(1, int(round(hz)))
        ctx.framerate = Fraction(int(round(hz)), 1)
        ctx.gop_size = keyint
        ctx.max_b_frames = 0
        ctx.thread_count = 1
        ctx.options = {
            "preset": preset,
            "tune": "zerolatency",
            "crf": str(H264_CRF),
            "x264-params": x264_params(
                f"keyint={keyint}",
                f"min-keyint={keyint}",
                "scenecut=0",
                "bframes=0",
                "repeat-headers=1",
                "rc-lookahead=0",
            ),
        }
        self._pts = 0

    def encode(self, bgr: np.ndarray) -> bytes:
        import av
        import cv2

        # OpenCV's fixed-point colour conversion: several times faster than swscale here.
        frame = av.VideoFrame.from_ndarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420), format="yuv420p")
        frame.pts = self._pts
        out = self._ctx.encode(frame)
        if len(out) != 1:
            raise RuntimeError(
                f"H.264 encoder returned {len(out)} packets for frame {self._pts}; expected exactly one"
            )
        self._pts += 1
        return bytes(out[0])

    def close(self) -> None:
        if self._ctx.encode(None):
            raise RuntimeError("H.264 encoder held back frames; expected none with zerolatency settings")


def _camera_message(
    camera: str, t_ns: int, payload: bytes, image_format: str, frame_id: str = CAMERA_FRAME_ID
) -> bytes:
    msg = CompressedImage() if camera == "image" else CompressedVideo()
    msg.timestamp.FromNanoseconds(int(t_ns))
    msg.frame_id = frame_id
    msg.data = payload
    msg.format = image_format if camera == "image" else "h264"
    return msg.SerializeToString(deterministic=True)


def _imu_messages(plan: MotionPlan, rng: np.random.Generator, hz: float) -> list[tuple[int, bytes]]:
    """IMU samples of the raw recording: specific force and angular rate in the tool frame,
    from finite differences of the plan, with a little sensor noise."""
    from scipy.spatial.transform import Rotation

    t = sample_clock(rng, plan.start_ns, plan.end_ns, hz, 0.0)
    if len(t) < 3:
        return []
    dt = np.diff(t).astype(np.float64) / 1e9  # (N-1,)
    position, quat = plan.pose_at(t)
    rot = Rotation.from_quat(quat)
    t_s = (t - t[0]).astype(np.float64) / 1e9
    accel_world = np.gradient(np.gradient(position, t_s, axis=0), t_s, axis=0) + [0.0, 0.0, 9.81]
    accel = rot.inv().apply(accel_world) + rng.normal(0.0, 0.02, size=(len(t), 3))
    gyro_step = (rot[:-1].inv() * rot[1:]).as_rotvec() / dt[:, None]
    gyro = np.vstack([gyro_step, gyro_step[-1:]]) + rng.normal(0.0, 0.002, size=(len(t), 3))
    accel, gyro = np.round(accel, 5), np.round(gyro, 6)
    return [
        (
            int(ti),
            _json_message({"stamp_ns": int(ti), "accel_mps2": a.tolist(), "gyro_radps": g.tolist()}),
        )
        for ti, a, g in zip(t, accel, gyro)
    ]


def _swap_some(order: list[_Message], rng: np.random.Generator, fraction: float) -> list[_Message]:
    """Swaps a few neighbours from different channels: a logger with one queue per topic
    writes out of log_time order across topics, never within one (a stream's own order is
    its capture order, and a good recording keeps it)."""
    candidates = [i for i in range(0, len(order) - 1, 2) if order[i].channel != order[i + 1].channel]
    if fraction <= 0.0 or not candidates:
        return order
    count = min(len(candidates), max(1, int(round(fraction * len(order)))))
    order = list(order)
    for i in sorted(rng.choice(candidates, size=count, replace=False).tolist()):
        order[i], order[i + 1] = order[i + 1], order[i]
    return order


def simulate_recording(
    plan: MotionPlan,
    timing: StreamTiming,
    rng: np.random.Generator,
    *,
    camera: str = "image",
    image_format: str = "jpeg",
    image_size: tuple[int, int] = (320, 240),
    timecode: bool = False,
) -> SimulatedRecording:
    """Samples the plan on each stream's clock, renders and encodes the camera frames and
    builds every message with its log time. `timecode` draws each frame's capture time
    into its top sixth (see `scene.timecode_value` / `read_timecode`)."""
    if camera not in ("image", "video"):
        raise ValueError(f"camera={camera!r}: use 'image' or 'video'")
    if image_format not in ("jpeg", "png"):
        raise ValueError(f"image_format={image_format!r}: use 'jpeg' or 'png'")
    if camera == "video" and image_format != "jpeg":
        raise ValueError("image_format applies to camera='image' only; leave it at 'jpeg' for video")
    width_px, height_px = image_size
    if width_px % 2 or height_px % 2 or width_px < 16 or height_px < 16:
        raise ValueError(f"image_size={image_size}: use even sizes of at least 16 pixels")

    def span(start_s: float, stop_s: float) -> tuple[int, int]:
        return plan.start_ns + int(round(start_s * 1e9)), plan.end_ns - int(round(stop_s * 1e9))

    camera_ns, dropped = camera_clock(
        rng,
        span(timing.camera_start_s, timing.camera_stop_s),
        timing.camera_hz,
        timing.camera_jitter_s,
        timing.camera_drop_fraction,
    )
    pose_ns = sample_clock(
        rng, *span(timing.pose_start_s, timing.pose_stop_s), timing.pose_hz, timing.pose_jitter_s
    )
    width_ns = sample_clock(
        rng, *span(timing.width_start_s, timing.width_stop_s), timing.width_hz, timing.width_jitter_s
    )

    # The device records H.264 (raw S.mcap); the studio writes the frames it processed
    # either as the same H.264 stream or as JPEG/PNG images (S_vio.mcap).
    raw_encoder = _H264Encoder(image_size, timing.camera_hz, RAW_H264_PRESET)
    vio_encoder = _H264Encoder(image_size, timing.camera_hz, VIO_H264_PRESET) if camera == "video" else None
    raw_payloads, payloads = [], []
    for bgr in render_frames_bgr(
        plan, camera_ns, image_size, timecode=timecode, texture=table_texture(plan.scene)
    ):
        raw_payloads.append(raw_encoder.encode(bgr))
        payloads.append(vio_encoder.encode(bgr) if vio_encoder else _encode_image(bgr, image_format))
    raw_encoder.close()
    if vio_encoder:
        vio_encoder.close()

    position, quat = plan.pose_at(pose_ns)
    width_m = plan.width_at(width_ns)

    streams: list[tuple[str, np.ndarray, list[bytes]]] = [
        (
            camera,
            camera_ns,
            [_camera_message(camera, t, p, image_format) for t, p in zip(camera_ns, payloads)],
        ),
        ("pose", pose_ns, [_pose_message(t, p, q) for t, p, q in zip(pose_ns, position, quat)]),
        (
            "width",
            width_ns,
            [_json_message({"stamp_ns": int(t), "width_m": float(w)}) for t, w in zip(width_ns, width_m)],
        ),
    ]
    if timing.diagnostics_hz > 0.0:
        diag_ns = sample_clock(rng, plan.start_ns, plan.end_ns, timing.diagnostics_hz, 0.0)
        features = rng.integers(80, 400, size=len(diag_ns))
        streams.append(
            (
                "diagnostics",
                diag_ns,
                [
                    _json_message({"stamp_ns": int(t), "level": "ok", "tracked_features": int(n)})
                    for t, n in zip(diag_ns, features)
                ],
            )
        )

    vio: list[tuple[int, int, int, _Message]] = []
    for rank, (key, capture, datas) in enumerate(streams):
        for i, (log_ns, data) in enumerate(zip(_log_times(rng, capture, timing), datas)):
            vio.append((int(log_ns), rank, i, _Message(key, int(log_ns), data)))
    vio.sort(key=lambda m: m[:3])  # total order: never depends on anything but the values
    vio_messages = _swap_some([m[3] for m in vio], rng, timing.out_of_order_fraction)

    # The raw recording: the camera as the device logged it (H.264), plus the IMU.
    raw: list[tuple[int, int, int, _Message]] = []
    camera_log = camera_ns + np.round(rng.uniform(0.0005, 0.002, len(camera_ns)) * 1e9).astype(np.int64)
    for i, (t, log_ns, payload) in enumerate(zip(camera_ns, camera_log, raw_payloads)):
        raw.append(
            (int(log_ns), 0, i, _Message("video", int(log_ns), _camera_message("video", t, payload, "h264")))
        )
    for i, (t, data) in enumerate(_imu_messages(plan, rng, timing.imu_hz)):
        raw.append((t + 200_000, 1, i, _Message("imu", t + 200_000, data)))
    raw.sort(key=lambda m: m[:3])

    truth = RecordingTruth(
        camera=camera,
        camera_ns=camera_ns,
        dropped_frames=dropped,
        pose_ns=pose_ns,
        width_ns=width_ns,
    )
    return SimulatedRecording(
        plan=plan,
        timing=timing,
        truth=truth,
        vio_messages=tuple(vio_messages),
        raw_messages=tuple(m[3] for m in raw),
    )


class Encoded(Protocol):
    """A recording ready to write: a `SimulatedRecording`, or a `rig.RigRecording`."""

    @property
    def truth(self) -> Any: ...

    @property
    def vio_messages(self) -> tuple[_Message, ...]: ...

    @property
    def raw_messages(self) -> tuple[_Message, ...]: ...


_COMPRESSION = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4, "none": CompressionType.NONE}


def _write_mcap(
    path: Path, messages: tuple[_Message, ...], *, compression: str, chunked: bool, summary: bool
) -> None:
    """Writes messages in the given order. Channels are registered in a fixed order, before
    any message, so ids never depend on which message comes first."""
    if compression not in _COMPRESSION:
        raise ValueError(f"compression={compression!r}: use one of {sorted(_COMPRESSION)}")
    used = {m.channel for m in messages}
    keys = [k for k in _CHANNELS if k in used] + sorted(used - set(_CHANNELS))
    with open(path, "wb") as f:
        writer = Writer(
            f,
            chunk_size=CHUNK_SIZE,
            compression=_COMPRESSION[compression],
            use_chunking=chunked,
            # Without a summary the file ends DataEnd, Footer(summary_start=0), magic: what
            # a writer leaves that only streams and never indexes.
            index_types=IndexType.ALL if summary else IndexType.NONE,
            repeat_channels=summary,
            repeat_schemas=summary,
            use_statistics=summary,
            use_summary_offsets=summary,
        )
        writer.start(profile="", library=MCAP_LIBRARY)
        channel_ids = {}
        for key in keys:
            ch = _channel(key)
            schema_id = writer.register_schema(ch.schema_name, ch.schema_encoding, ch.schema_data)
            channel_ids[key] = writer.register_channel(ch.topic, ch.message_encoding, schema_id)
        sequence = dict.fromkeys(keys, 0)
        for m in messages:
            writer.add_message(
                channel_id=channel_ids[m.channel],
                log_time=m.log_ns,
                publish_time=m.log_ns,
                data=m.data,
                sequence=sequence[m.channel],
            )
            sequence[m.channel] += 1
        writer.finish()


def write_simulated_vio(
    path: Path,
    recording: Encoded,
    *,
    compression: str = "zstd",
    chunked: bool = True,
    summary: bool = True,
) -> RecordingTruth:
    """Writes `S_vio.mcap`: camera, /vio/pose, /gripper/width (and /diagnostics if any)."""
    _write_mcap(Path(path), recording.vio_messages, compression=compression, chunked=chunked, summary=summary)
    return recording.truth


def write_simulated_raw(path: Path, recording: Encoded, *, compression: str = "zstd") -> None:
    """Writes `S.mcap`: the camera as recorded on the device (H.264 on /camera0/video) and
    /imu (JSON, ~200 Hz)."""
    _write_mcap(Path(path), recording.raw_messages, compression=compression, chunked=True, summary=True)


def write_vio_mcap(
    path: Path,
    plan: MotionPlan,
    timing: StreamTiming,
    rng: np.random.Generator,
    *,
    camera: str = "image",
    image_format: str = "jpeg",
    compression: str = "zstd",
    chunked: bool = True,
    summary: bool = True,
    timecode: bool = False,
    image_size: tuple[int, int] = (320, 240),
) -> RecordingTruth:
    """Simulates one recording and writes its `S_vio.mcap`; returns what was written."""
    rec = simulate_recording(
        plan, timing, rng, camera=camera, image_format=image_format, image_size=image_size, timecode=timecode
    )
    return write_simulated_vio(path, rec, compression=compression, chunked=chunked, summary=summary)


def write_raw_mcap(
    path: Path,
    plan: MotionPlan,
    timing: StreamTiming,
    rng: np.random.Generator,
    *,
    camera: str = "image",
    compression: str = "zstd",
    image_size: tuple[int, int] = (320, 240),
) -> RecordingTruth:
    """Simulates one recording and writes its raw `S.mcap` (camera and IMU)."""
    rec = simulate_recording(plan, timing, rng, camera=camera, image_size=image_size)
    write_simulated_raw(path, rec, compression=compression)
    return rec.truth
