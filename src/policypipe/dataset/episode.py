"""One recording's streams -> one episode on the camera clock.

For every kept camera frame, the gripper pose and width at that frame's capture time are
interpolated (linear for position and width, spherical for orientation). Frames outside the
span covered by pose and width are trimmed, never extrapolated. The pose and width samples
themselves are kept too, over the kept frames' span plus the one sample on each side, so a
target can be interpolated at any time of the episode (`PoseInterpolator`, `interpolate_width`:
the same code for the frames here and for the policy's windows). Timestamps stay integer
nanoseconds until the final relative float64 seconds.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import av
import cv2
import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from policypipe.dataset.convert_config import ConvertConfig
from policypipe.recordings.h264 import Verdict, each_reference_check
from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import CameraStream, GripperStreams, Streams, stream_name

log = logging.getLogger(__name__)


@dataclass
class GripperEpisode:
    """One gripper's pose and width at the episode's frames, and its recorded samples."""

    eef_pos: np.ndarray  # float32 (N, 3)
    eef_rot_axis_angle: np.ndarray  # float32 (N, 3)
    gripper_width: np.ndarray  # float32 (N, 1)
    # The recorded pose and width samples covering the kept frames (see `covering`).
    pose_ns: np.ndarray  # int64 (P,)
    pose_position: np.ndarray  # float64 (P, 3)
    pose_rot_axis_angle: np.ndarray  # float64 (P, 3)
    width_ns: np.ndarray  # int64 (W,)
    width_values: np.ndarray  # float64 (W,)


@dataclass
class CameraEpisode:
    """A camera other than camera 0 at the episode's frames: its frame nearest each one in time."""

    rgb: np.ndarray  # uint8 (N, H, W, 3); black where not `valid`
    offset_ns: np.ndarray  # int64 (N,), its frame's capture time minus the row's; 0 where absent
    valid: np.ndarray  # bool (N,), a frame within convert.max_camera_offset_ms
    topic: str  # "" when the camera is absent from the recording
    frames_in: int  # its messages read
    own_ns: np.ndarray  # int64, its usable frames' capture times inside the episode's span
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def frequency_hz(self) -> float | None:
        return measured_frequency(self.own_ns) if len(self.own_ns) >= 2 else None

    @property
    def gaps(self) -> int:
        return missing_frames(self.own_ns)


@dataclass
class Episode:
    rgb: np.ndarray  # uint8 (N, H, W, 3), camera 0: the dataset's clock
    grippers: dict[int, GripperEpisode]  # gripper 0 and every other kept one
    capture_ns: np.ndarray  # int64 (N,), absolute capture time of each kept frame of camera 0
    frames_in: int  # camera 0 messages read (lost ones are not among them)
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    camera_topic: str = ""
    # Messages per stream (`streams.stream_name`) lost to damage in the file: never read.
    lost_messages: dict[str, int] = field(default_factory=dict)
    # Why reading stopped before the end of a file without an index to skip damage, or None.
    read_stopped: str | None = None
    # With convert.resample_hz: |capture time - grid time| of the frame chosen for each grid time.
    resample_offset_ns: np.ndarray | None = None
    # Camera 0's own frames inside the pose and width span, before any resampling: its rate and
    # drops are measured on them (the frames kept on a grid would show the grid and its jitter).
    camera_ns: np.ndarray | None = None
    cameras: dict[int, CameraEpisode] = field(default_factory=dict)  # the other kept cameras

    # Gripper 0: all of a version 1 recording.
    @property
    def eef_pos(self) -> np.ndarray:
        return self.grippers[0].eef_pos

    @property
    def eef_rot_axis_angle(self) -> np.ndarray:
        return self.grippers[0].eef_rot_axis_angle

    @property
    def gripper_width(self) -> np.ndarray:
        return self.grippers[0].gripper_width

    @property
    def pose_ns(self) -> np.ndarray:
        return self.grippers[0].pose_ns

    @property
    def pose_position(self) -> np.ndarray:
        return self.grippers[0].pose_position

    @property
    def pose_rot_axis_angle(self) -> np.ndarray:
        return self.grippers[0].pose_rot_axis_angle

    @property
    def width_ns(self) -> np.ndarray:
        return self.grippers[0].width_ns

    @property
    def width_values(self) -> np.ndarray:
        return self.grippers[0].width_values

    @property
    def frequency_hz(self) -> float:
        """The camera's rate, measured on its own frames."""
        return measured_frequency(self.camera_ns if self.camera_ns is not None else self.capture_ns)

    @property
    def camera_gaps(self) -> int:
        return missing_frames(self.camera_ns if self.camera_ns is not None else self.capture_ns)


def frame_interval_ns(capture_ns: np.ndarray) -> float:
    """The median frame interval, over intervals that are not gaps left by dropped frames.

    A plain median is pulled up by drops (each one a double interval); taking the median again
    over intervals shorter than 1.5x the first estimate leaves only the camera's own clock.
    """
    if len(capture_ns) < 2:
        return float("nan")
    intervals = np.diff(capture_ns).astype(np.float64)
    rough = np.median(intervals)
    return float(np.median(intervals[intervals < 1.5 * rough]))


def _no_overlap(t_cam: np.ndarray, samples: dict[int, _CleanSamples]) -> str:
    """Why no camera frame has every gripper's pose and width: the spans, and how far apart (another
    clock?); with several grippers, whose."""
    origin = samples[0].pose_t[0]

    def span(t: np.ndarray) -> str:
        return f"{(t[0] - origin) / 1e9:+.3f}..{(t[-1] - origin) / 1e9:+.3f} s"

    def both(g: _CleanSamples) -> tuple[int, int]:
        return max(g.pose_t[0], g.width_t[0]), min(g.pose_t[-1], g.width_t[-1])

    def where(lo: int, hi: int) -> str:
        if lo > hi:
            return "pose and width do not overlap each other"
        if t_cam[0] > hi:
            return f"the camera starts {(t_cam[0] - hi) / 1e9:.3f} s after pose and width end"
        return f"the camera ends {(lo - t_cam[-1]) / 1e9:.3f} s before pose and width begin"

    def spans(i: int, g: _CleanSamples) -> str:
        name = "" if len(samples) == 1 else f"gripper {i}'s "
        return f"{name}pose {span(g.pose_t)}, {name}width {span(g.width_t)}"

    clock = (
        "Capture times of all streams must be on one clock (recording-format.md): check the studio's "
        "time source"
    )
    if len(samples) == 1:
        return (
            f"no camera frame lies within the pose and width time span: {where(*both(samples[0]))} "
            f"(from the first pose sample: camera {span(t_cam)}, {spans(0, samples[0])}). {clock}"
        )
    alone = {i: both(g) for i, g in samples.items()}
    apart = [i for i, (lo, hi) in alone.items() if not ((t_cam >= lo) & (t_cam <= hi)).any()]
    if apart:
        what = "; ".join(f"gripper {i}: {where(*alone[i])}" for i in apart)
    else:  # each overlaps the camera, not all at once
        late = max(alone, key=lambda i: alone[i][0])
        early = min(alone, key=lambda i: alone[i][1])
        if alone[late][0] > alone[early][1]:
            what = f"gripper {late}'s pose and width begin after gripper {early}'s end"
        else:
            what = "the span they all share holds no camera frame"
    listed = ", ".join(spans(i, g) for i, g in samples.items())
    return (
        "no camera frame lies within every gripper's pose and width time span: "
        f"{what} (from gripper 0's first pose sample: camera {span(t_cam)}, {listed}). {clock}"
    )


def measured_frequency(capture_ns: np.ndarray) -> float:
    return 1e9 / frame_interval_ns(capture_ns)


def missing_frames(capture_ns: np.ndarray) -> int:
    """Frames the camera's clock says are missing between the kept ones (drops, not jitter)."""
    if len(capture_ns) < 2:
        return 0
    interval = frame_interval_ns(capture_ns)
    if not interval > 0:  # no clock to measure against (all timestamps equal, or mostly backwards)
        return 0
    slots = np.rint(np.diff(capture_ns) / interval).astype(np.int64)
    return int(np.clip(slots - 1, 0, None).sum())


# ---------------------------------------------------------------- camera

# Why a camera message gives no frame (keys of Episode.dropped).
UNDECODABLE = "undecodable"  # empty or corrupt bytes, or the decoder failed on them
REFERENCE_LOST = "h264_reference_lost"  # decodes, but against a reference frame that was lost


@dataclass
class DecodedFrames:
    """Every camera message, decoded and resized, in file order."""

    capture_ns: np.ndarray  # int64 (M,)
    rgb: np.ndarray  # uint8 (M, H, W, 3) at the stored size; rows of dropped frames stay black
    dropped: list[str | None]  # (M,) UNDECODABLE, REFERENCE_LOST, or None for a usable frame

    @property
    def usable(self) -> np.ndarray:
        return np.array([reason is None for reason in self.dropped], dtype=bool)


def decode_frames(camera: CameraStream, image_size: tuple[int, int]) -> DecodedFrames:
    """Every frame of `camera`, decoded and resized into an output of the stored size, one frame
    at a time (`each_decoded_frame`)."""
    w, h = image_size
    # np.zeros: the pages of frames that are never written are never touched.
    rgb = np.zeros((len(camera.data), h, w, 3), np.uint8)
    dropped: list[str | None] = [UNDECODABLE] * len(camera.data)
    for index, frame, reason in each_decoded_frame(camera, image_size):
        if frame is not None:
            rgb[index] = frame
        dropped[index] = reason
    return DecodedFrames(capture_ns=camera.ns, rgb=rgb, dropped=dropped)


def each_decoded_frame(
    camera: CameraStream, image_size: tuple[int, int] | None
) -> Iterator[tuple[int, np.ndarray | None, str | None]]:
    """(message index, RGB frame or None, why not: UNDECODABLE, REFERENCE_LOST or None) once for
    every message of `camera`, resized to `image_size` (None: the camera's own resolution).

    Convert's decoder loop, and `policypipe predict`'s. Memory holds one full-resolution frame at a
    time (plus the H.264 decoder's own reference frames), never all of them: 60 frames of
    8000x6000 would be 8.6 GB. Stills come in file order; H.264 frames in the order the decoder
    hands them back (with B-frames, not file order), matched to their messages through the packet
    timestamp, never by position: a frame the decoder drops must not shift every later frame.
    """
    if camera.format == "h264":
        yield from _decode_h264(camera.data, image_size)
    elif camera.format == "rgb":  # raw rows of an HDF5 source: resized only
        for index, frame in enumerate(camera.data):
            frame = np.asarray(frame)
            yield index, frame if image_size is None else resize_frame(frame, image_size), None
    else:
        swap = camera.format != "jpeg_rgb"
        for index, data in enumerate(camera.data):
            frame = _decode_still(data, image_size, swap)
            yield index, frame, UNDECODABLE if frame is None else None


def decode_still_bgr(data: bytes) -> np.ndarray | None:
    """One JPEG/PNG camera message at its own resolution, BGR (OpenCV's order); None when it
    cannot be decoded. Convert and `policypipe predict` (a camera driver's view) both decode so."""
    if not data:  # a zero-length message: cv2.imdecode asserts on an empty buffer
        return None
    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)  # None: not an image
    except cv2.error as exc:
        log.debug("undecodable still frame: %s", exc)
        return None


def _decode_still(data: bytes, image_size: tuple[int, int] | None, swap: bool = True) -> np.ndarray | None:
    """One JPEG/PNG as RGB at `image_size` (None: its own), or None. `swap` false: the image was
    encoded from an RGB array as if BGR, so OpenCV's decoded order is RGB already."""
    bgr = decode_still_bgr(data)
    if bgr is None:
        return None
    # Resize first, then swap channels: both work on each channel alone, so the bytes are the
    # same as swap-then-resize, and no second full-resolution buffer is made.
    small = bgr if image_size is None else resize_frame(bgr, image_size)
    return cv2.cvtColor(small, cv2.COLOR_BGR2RGB) if swap else small


def _decode_h264(
    packets: Sequence[bytes], image_size: tuple[int, int] | None
) -> Iterator[tuple[int, np.ndarray | None, str | None]]:
    """Decodes the stream in file order; yields (message index, frame, reason) as
    `each_decoded_frame` does.

    A P or B picture decodes against earlier reference pictures. After a lost reference, or a
    packet the decoder fails on, every picture up to the next IDR decodes against the wrong
    reference: the decoder conceals the damage silently (it neither raises nor flags the frame
    corrupt), so those frames are dropped here as REFERENCE_LOST. A lost reference shows in
    the bitstream itself, as a gap in the slice headers' frame_num (`h264.check_references`),
    never in the capture times: a camera that drops a frame before encoding leaves a
    timestamp gap over an intact stream (a camera gap, counted elsewhere, not a loss), and
    with B-frames file order is not time order. Packets that cannot be read (empty ones
    included) are UNDECODABLE and never reach the decoder, like lost ones.
    """
    codec = av.CodecContext.create("h264", "r")
    codec.thread_count = 1  # decoded pixels must not depend on the machine's core count
    count = len(packets)
    reference_lost = np.zeros(count, dtype=bool)
    handed_back = np.zeros(count, dtype=bool)

    def collect(frames: list[av.VideoFrame]) -> Iterator[tuple[int, np.ndarray | None, str | None]]:
        for frame in frames:
            index = -1 if frame.pts is None else int(frame.pts)
            if 0 <= index < count and not handed_back[index]:
                handed_back[index] = True
                if reference_lost[index]:
                    yield index, None, REFERENCE_LOST
                else:
                    # rgb24 at full size, then the same resize as a still: one full-size frame alive.
                    rgb = frame.to_ndarray(format="rgb24")
                    yield index, rgb if image_size is None else resize_frame(rgb, image_size), None

    # The decoder failed on a packet since the last IDR: what that cost its references does
    # not show in the bitstream, so everything up to the next IDR is suspect.
    decoder_failed = False
    for index, (data, check) in enumerate(each_reference_check(packets)):
        if check.verdict is Verdict.UNREADABLE:
            # Never sent: an empty packet would tell the decoder "end of stream", and a
            # damaged one would leave a concealed picture among its references.
            continue
        if check.idr:
            decoder_failed = False
        reference_lost[index] = check.verdict is Verdict.BROKEN or decoder_failed
        packet = av.Packet(data)
        packet.pts = packet.dts = index  # the message's identity travels with the packet
        try:
            decoded = codec.decode(packet)
        except av.error.FFmpegError as exc:
            # With its references intact the packet's own bytes are at fault (UNDECODABLE); with
            # them lost the failure is theirs.
            log.debug("undecodable H.264 packet %d: %s", index, exc)
            decoder_failed = True
            continue
        yield from collect(decoded)
    try:
        yield from collect(codec.decode(None))
    except av.error.FFmpegError:
        pass
    for index in np.flatnonzero(~handed_back):
        yield int(index), None, REFERENCE_LOST if reference_lost[index] else UNDECODABLE


def resize_frame(image: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """To (width, height): area averaging to shrink, bilinear to enlarge."""
    w, h = image_size
    if image.shape[1] == w and image.shape[0] == h:
        return np.ascontiguousarray(image)
    interpolation = cv2.INTER_AREA if image.shape[1] >= w else cv2.INTER_LINEAR
    return cv2.resize(image, (w, h), interpolation=interpolation)


# ---------------------------------------------------------------- pose and width


class PoseInterpolator:
    """The pose at any time from samples at strictly increasing times `x_pose` (P,): position
    (P, 3) linearly, orientation (P rotations) by spherical linear interpolation.

    Times are float64 offsets from a reference near them (never absolute Unix ns, which float64
    cannot hold). The one pose interpolator: convert uses it at each frame, the policy's windows
    at any time of an episode. Built once, it answers a few queries in O(log P).

    The orientation is scipy's `Slerp`, q_i * exp(alpha * log(q_i^-1 q_i+1)), with its quaternion
    product written out here: scipy 1.17's Rotation product allocates per quaternion (~330 ns
    each; scipy PR #25687 removed that after 1.17, and later scipy needs Python >= 3.12), and was
    most of the time of the policy's windows. The same operations in the same order: the same bits.
    """

    def __init__(self, x_pose: np.ndarray, position: np.ndarray, rotations: Rotation) -> None:
        self.x_pose = np.ascontiguousarray(x_pose, dtype=np.float64)
        # Contiguous columns: np.interp copies a strided one on every call.
        self.columns = [np.ascontiguousarray(position[:, k], dtype=np.float64) for k in range(3)]
        slerp = Slerp(self.x_pose, rotations)  # checks the times; each interval's rotation vector
        self.start = slerp.rotations.as_quat()  # (P - 1, 4) x, y, z, w at each interval's start
        self.rotvecs = slerp.rotvecs  # (P - 1, 3) from each interval's start to its end
        self.duration = slerp.timedelta  # (P - 1,)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, Rotation]:
        """((M, 3) positions, M orientations) at times `x` (M,) within the samples' span."""
        x = np.asarray(x, dtype=np.float64)
        position = np.stack([np.interp(x, self.x_pose, column) for column in self.columns], axis=1)
        # Interval i holds x_pose[i] < x <= x_pose[i + 1], and the first sample time too (as Slerp).
        i = np.searchsorted(self.x_pose, x) - 1
        i[x == self.x_pose[0]] = 0
        if len(x) and (i.min() < 0 or i.max() >= len(self.start)):
            raise ValueError(
                f"interpolation times must be within [{self.x_pose[0]}, {self.x_pose[-1]}], both inclusive"
            )
        alpha = (x - self.x_pose[i]) / self.duration[i]
        step = Rotation.from_rotvec(self.rotvecs[i] * alpha[:, None]).as_quat()
        return position, Rotation.from_quat(quaternion_product(self.start[i], step))


def quaternion_product(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(M, 4) p * q of (M, 4) x, y, z, w quaternions, unnormalised, term by term in the order of
    scipy's `Rotation.__mul__` (`Rotation.from_quat` then normalises it as `__mul__` does)."""
    (px, py, pz, pw), (qx, qy, qz, qw) = p.T, q.T
    return np.stack(
        [
            pw * qx + qw * px + (py * qz - pz * qy),
            pw * qy + qw * py + (pz * qx - px * qz),
            pw * qz + qw * pz + (px * qy - py * qx),
            pw * qw - px * qx - py * qy - pz * qz,
        ],
        axis=1,
    )


def interpolate_width(x: np.ndarray, x_width: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The gripper width at times `x` (M,), linearly between samples at `x_width` (W,)."""
    return np.interp(x, x_width, width)


def nearest_sample(times: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of the sample of `times` (sorted, at least 2) nearest each of `query`; a tie goes
    to the later sample, a query outside the span to the first or last sample."""
    nearest = np.clip(np.searchsorted(times, query), 1, len(times) - 1)
    nearest -= (query - times[nearest - 1]) < (times[nearest] - query)
    return nearest


def covering(times: np.ndarray, lo: int, hi: int) -> slice:
    """The samples of sorted `times` from the last one at or before `lo` to the first one at or
    after `hi`: interpolation anywhere in [lo, hi] needs these and no others."""
    return slice(
        max(int(np.searchsorted(times, lo, side="right")) - 1, 0),
        int(np.searchsorted(times, hi, side="left")) + 1,
    )


def clean_pose_span(
    pose_ns: np.ndarray, position: np.ndarray, quaternion: np.ndarray, config: ConvertConfig
) -> tuple[slice, int, np.ndarray, np.ndarray, np.ndarray]:
    """Sorts and de-duplicates pose samples and finds tracking loss.

    Returns (the longest clean span as a slice, the number of bad samples or jumps,
    times, positions, unit quaternions) over the sorted samples.
    """
    order = np.argsort(pose_ns, kind="stable")
    t, p, q = pose_ns[order], position[order], quaternion[order]
    keep = np.concatenate([[True], np.diff(t) > 0])
    t, p, q = t[keep], p[keep], q[keep]

    norm = np.linalg.norm(q, axis=1)
    valid = (
        np.isfinite(p).all(axis=1)
        & np.isfinite(q).all(axis=1)
        & (np.abs(norm - 1) <= config.quaternion_norm_tolerance)
    )
    q = np.where(valid[:, None], q / np.where(norm > 0, norm, 1)[:, None], q)

    # An edge between consecutive samples is broken if either end is invalid or the motion
    # between them is faster than a hand can move: tracking loss, not motion.
    dt = np.diff(t) / 1e9
    speed = np.linalg.norm(np.diff(p, axis=0), axis=1) / dt
    dot = np.abs(np.sum(q[1:] * q[:-1], axis=1)).clip(0, 1)
    angular = np.degrees(2 * np.arccos(dot)) / dt
    with np.errstate(invalid="ignore"):
        good_edge = (
            valid[1:]
            & valid[:-1]
            & (speed <= config.max_speed_m_s)
            & (angular <= config.max_angular_speed_deg_s)
        )
    problems = int((~valid).sum() + (valid[1:] & valid[:-1] & ~good_edge).sum())

    # Longest run of valid samples joined by good edges, by duration (earliest on a tie).
    bounds = [0, *(np.flatnonzero(~good_edge) + 1).tolist(), len(t)]
    runs = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if valid[a:b].all()]
    a, b = max(runs, key=lambda r: (t[r[1] - 1] - t[r[0]], -r[0]), default=(0, 0))
    best = slice(a, b)
    return best, problems, t, p, q


# Each damaged chunk or span of the file, as a warning of its episode (and of nothing else).
DAMAGE_WARNING = "damaged recording: "


def build_episode(streams: Streams, config: ConvertConfig) -> Episode:
    """The episode of one recording, or RecordingError saying why there is none; an exclusion
    names the file's damage too, which may be why too little is left (a cut, a lost chunk)."""
    try:
        return _build_episode(streams, config)
    except RecordingError as exc:
        damage = ([f"truncated: {streams.truncated}"] if streams.truncated else []) + list(streams.damage)
        if not damage:
            raise
        raise RecordingError(exc.reason, f"{exc}; the file is damaged: {'; '.join(damage)}") from None


def _build_episode(streams: Streams, config: ConvertConfig) -> Episode:
    dropped: Counter[str] = Counter()
    warnings: list[str] = list(streams.warnings)
    if streams.truncated:
        warnings.append(f"truncated recording: {streams.truncated}")
    warnings.extend(DAMAGE_WARNING + line for line in streams.damage)

    decoded = decode_frames(streams.cameras[0], config.image_size)
    camera_ns, frames_in = decoded.capture_ns, len(decoded.dropped)
    reasons = Counter(reason for reason in decoded.dropped if reason is not None)
    dropped.update(reasons)
    undecodable = reasons[UNDECODABLE]
    if undecodable:
        if undecodable > config.max_undecodable_fraction * frames_in:
            raise RecordingError(
                "undecodable_frames",
                f"{undecodable} of {frames_in} camera frames cannot be decoded "
                f"(limit: convert.max_undecodable_fraction = {config.max_undecodable_fraction})",
            )
    if reasons[REFERENCE_LOST] and reasons[REFERENCE_LOST] + undecodable == frames_in:
        # Not one frame with a sound reference: a stream that resynchronises without IDR pictures
        # (intra refresh, recovery points) or starts without one. Say so, not "too short".
        raise RecordingError(
            "h264_no_keyframe",
            f"none of the {frames_in} H.264 frames follows an IDR keyframe with intact references; "
            "streams that use intra refresh or recovery points instead of IDR frames are not supported: "
            "export with periodic IDR keyframes",
        )
    if reasons[REFERENCE_LOST]:
        # Not held to max_undecodable_fraction: their own bytes are sound, what failed is a
        # packet before them (and the hole they leave is counted as camera gaps, like a drop).
        warnings.append(
            f"{reasons[REFERENCE_LOST]} H.264 frames dropped: they reference a lost or undecodable packet "
            "(a frame_num gap in the bitstream, or before the first keyframe); "
            "kept again from the next keyframe"
        )
    out_of_order = int((np.diff(camera_ns) <= 0).sum())
    if out_of_order:
        warnings.append(
            f"{out_of_order} camera timestamps not increasing in file order: sorted by capture time"
        )

    usable = decoded.usable
    order = np.argsort(camera_ns, kind="stable")
    order = order[usable[order]]
    t_cam = camera_ns[order]
    unique = np.concatenate([[True], np.diff(t_cam) > 0]) if len(t_cam) else np.zeros(0, bool)
    if (~unique).any():
        dropped["duplicate_timestamp"] += int((~unique).sum())
    order, t_cam = order[unique], t_cam[unique]

    samples = {i: _clean_samples(i, gripper, config, warnings) for i, gripper in streams.grippers.items()}
    problems = sum(g.problems for g in samples.values())
    lo = max(max(g.pose_t[0], g.width_t[0]) for g in samples.values())
    hi = min(min(g.pose_t[-1], g.width_t[-1]) for g in samples.values())
    inside = (t_cam >= lo) & (t_cam <= hi)
    if len(t_cam) and not inside.any():
        raise RecordingError("no_time_overlap", _no_overlap(t_cam, samples))
    if problems:
        dropped["tracking_loss"] += int((~inside).sum())
    else:
        dropped["outside_pose_or_width_span"] += int((~inside).sum())
    order, t_cam = order[inside], t_cam[inside]

    resample_offset_ns, camera_ns = None, t_cam
    if config.resample_hz is not None and len(t_cam) >= 2:
        step = int(round(1e9 / config.resample_hz))
        grid = np.arange(t_cam[0], t_cam[-1] + 1, step, dtype=np.int64)
        nearest = nearest_sample(t_cam, grid)
        resample_offset_ns = np.abs(t_cam[nearest] - grid)
        # Each chosen frame keeps its own capture time, and pose and width are interpolated at
        # it: image and pose are of the same moment, whatever the grid. A frame nearest to two
        # grid times (dropped frames, or a camera slower than the grid) is kept once.
        nearest = np.unique(nearest)
        order, t_cam = order[nearest], t_cam[nearest]

    if len(t_cam) < config.min_frames:
        raise RecordingError(
            "too_short", f"{len(t_cam)} usable frames, fewer than convert.min_frames = {config.min_frames}"
        )

    cameras = {
        k: _other_camera(k, streams, t_cam, (lo, hi), config, warnings) for k in config.cameras if k != 0
    }
    return Episode(
        rgb=decoded.rgb[order],
        grippers={i: g.at(t_cam) for i, g in samples.items()},
        capture_ns=t_cam,
        frames_in=frames_in,
        dropped={k: v for k, v in sorted(dropped.items()) if v},
        warnings=warnings,
        camera_topic=streams.camera_topic,
        lost_messages=dict(sorted(streams.lost.items())),
        read_stopped=streams.truncated,
        resample_offset_ns=resample_offset_ns,
        camera_ns=camera_ns,
        cameras=cameras,
    )


@dataclass
class _CleanSamples:
    """One gripper's pose and width samples, sorted, de-duplicated, its longest clean pose span."""

    problems: int  # invalid pose samples or jumps
    pose_t: np.ndarray
    pos: np.ndarray
    quat: np.ndarray
    width_t: np.ndarray
    width: np.ndarray

    def at(self, t_cam: np.ndarray) -> GripperEpisode:
        """Its pose and width at the frames `t_cam`, and the samples that cover them."""
        # Interpolate on int64 offsets from a reference, so float64 keeps nanosecond precision.
        pose_t, width_t, ref = self.pose_t, self.width_t, self.pose_t[0]
        x_cam = (t_cam - ref).astype(np.float64)
        pose = PoseInterpolator((pose_t - ref).astype(np.float64), self.pos, Rotation.from_quat(self.quat))
        eef_pos, rot = pose(x_cam)
        grip = interpolate_width(x_cam, (width_t - ref).astype(np.float64), self.width)
        pose_kept, width_kept = covering(pose_t, t_cam[0], t_cam[-1]), covering(width_t, t_cam[0], t_cam[-1])
        return GripperEpisode(
            eef_pos=eef_pos.astype(np.float32),
            eef_rot_axis_angle=rot.as_rotvec().astype(np.float32),
            gripper_width=grip.astype(np.float32)[:, None],
            pose_ns=pose_t[pose_kept],
            pose_position=self.pos[pose_kept].astype(np.float64),
            pose_rot_axis_angle=Rotation.from_quat(self.quat[pose_kept]).as_rotvec(),
            width_ns=width_t[width_kept],
            width_values=self.width[width_kept].astype(np.float64),
        )


def _clean_samples(
    i: int, gripper: GripperStreams, config: ConvertConfig, warnings: list[str]
) -> _CleanSamples:
    whose = "" if i == 0 else f"gripper {i}: "
    span, problems, pose_t, pos, quat = clean_pose_span(
        gripper.pose_ns, gripper.position, gripper.quaternion, config
    )
    if problems:
        if config.on_tracking_loss == "exclude" or span.stop - span.start < 2:
            raise RecordingError(
                "tracking_loss",
                f"{whose}VIO tracking loss: {problems} invalid pose samples or jumps faster than "
                f"{config.max_speed_m_s} m/s / {config.max_angular_speed_deg_s} deg/s",
            )
        warnings.append(
            f"{whose}VIO tracking loss ({problems} bad samples or jumps): kept the longest clean span"
        )
    pose_t, pos, quat = pose_t[span], pos[span], quat[span]

    w_order = np.argsort(gripper.width_ns, kind="stable")
    width_t, width = gripper.width_ns[w_order], gripper.width[w_order]
    w_keep = np.concatenate([[True], np.diff(width_t) > 0]) & np.isfinite(width)
    width_t, width = width_t[w_keep], width[w_keep]
    if len(width_t) < 2 or len(pose_t) < 2:
        raise RecordingError("too_short", f"{whose}fewer than two usable pose or width samples")
    return _CleanSamples(problems, pose_t, pos, quat, width_t, width)


def _other_camera(
    k: int,
    streams: Streams,
    t_cam: np.ndarray,
    span: tuple[int, int],
    config: ConvertConfig,
    warnings: list[str],
) -> CameraEpisode:
    """Camera k's frame nearest in time to each of camera 0's kept frames `t_cam`; a row without one
    within convert.max_camera_offset_ms has none (`valid` false). An absent camera, or one missing
    for more than convert.max_undecodable_fraction of the rows, excludes the recording unless
    convert.on_missing_camera is "mask"."""
    w, h = config.image_size
    n = len(t_cam)
    name = stream_name("camera", k)
    if k not in streams.cameras:
        looked = streams.camera_sources.get(k) or "topics " + " or ".join(config.topics.camera_candidates(k))
        if config.on_missing_camera == "exclude":
            raise RecordingError(
                "missing_camera",
                f"{name} has no readable frame ({looked}); "
                "convert.on_missing_camera: mask keeps such recordings with the camera marked absent",
            )
        warnings.append(f"{name} has no readable frame in the recording: every row marks it missing")
        return CameraEpisode(
            rgb=np.zeros((n, h, w, 3), np.uint8),
            offset_ns=np.zeros(n, np.int64),
            valid=np.zeros(n, bool),
            topic="",
            frames_in=0,
            own_ns=np.zeros(0, np.int64),
        )
    decoded = decode_frames(streams.cameras[k], config.image_size)
    reasons = Counter(reason for reason in decoded.dropped if reason is not None)
    order = np.argsort(decoded.capture_ns, kind="stable")
    order = order[decoded.usable[order]]
    own = decoded.capture_ns[order]
    unique = np.concatenate([[True], np.diff(own) > 0]) if len(own) else np.zeros(0, bool)
    reasons["duplicate_timestamp"] += int((~unique).sum())
    order, own = order[unique], own[unique]
    if len(own) == 0:
        nearest, offset = np.zeros(n, np.int64), np.zeros(n, np.int64)
        valid = np.zeros(n, bool)
    else:
        nearest = nearest_sample(own, t_cam) if len(own) >= 2 else np.zeros(n, np.int64)
        offset = own[nearest] - t_cam
        valid = np.abs(offset) <= int(round(config.max_camera_offset_ms * 1e6))
    missing = int((~valid).sum())
    if missing > config.max_undecodable_fraction * n:
        detail = (
            f"{name} has no frame within convert.max_camera_offset_ms = {config.max_camera_offset_ms} ms "
            f"of {missing} of {n} rows (limit: convert.max_undecodable_fraction = "
            f"{config.max_undecodable_fraction})"
        )
        if config.on_missing_camera == "exclude":
            raise RecordingError(
                "camera_gaps", f"{detail}; convert.on_missing_camera: mask keeps it with those rows marked"
            )
        warnings.append(f"{detail}: those rows mark it missing")
    rgb = decoded.rgb[order[nearest]] if len(own) else np.zeros((n, h, w, 3), np.uint8)
    rgb[~valid] = 0
    inside = own[(own >= span[0]) & (own <= span[1])]
    return CameraEpisode(
        rgb=rgb,
        offset_ns=np.where(valid, offset, 0).astype(np.int64),
        valid=valid,
        topic=streams.cameras[k].topic,
        frames_in=len(decoded.dropped),
        own_ns=inside,
        dropped={r: c for r, c in sorted(reasons.items()) if c},
    )
