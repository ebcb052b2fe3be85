"""Alignment and quality rules on hand-made streams with a known truth."""

from __future__ import annotations

import dataclasses
import tracemalloc
import types
import weakref
from collections.abc import Callable

import av
import cv2
import numpy as np
import pytest
from scipy.spatial.transform import Rotation, Slerp

from policypipe.dataset import episode
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import PoseInterpolator, build_episode, clean_pose_span, measured_frequency
from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import Streams
from policypipe.synthetic.recording import _H264Encoder

T0 = 1_762_160_000_000_000_000  # absolute ns, large enough that float64 seconds would lose precision
CONFIG = ConvertConfig(image_size=(32, 24), min_frames=5)


def truth_position(t_s):
    return np.stack([0.1 * np.sin(t_s), 0.05 * t_s, 0.2 + 0.01 * np.cos(3 * t_s)], axis=-1)


def truth_rotation(t_s):
    return Rotation.from_rotvec(np.stack([0.2 * np.sin(t_s), 0.1 * t_s, 0.3 * np.ones_like(t_s)], axis=-1))


def jpeg(value: int) -> bytes:
    image = np.full((48, 64, 3), value, np.uint8)
    return cv2.imencode(".jpg", image)[1].tobytes()


def make_streams(camera_hz=30.0, pose_hz=150.0, seconds=2.0, camera_offset_s=0.1, **overrides) -> Streams:
    cam_t = T0 + np.round((camera_offset_s + np.arange(int(seconds * camera_hz)) / camera_hz) * 1e9).astype(
        np.int64
    )
    pose_t = T0 + np.round(np.arange(int((seconds + 0.3) * pose_hz)) / pose_hz * 1e9).astype(np.int64)
    pose_s = (pose_t - T0) / 1e9
    width_t = T0 + np.round(np.arange(int((seconds + 0.3) * 45)) / 45 * 1e9).astype(np.int64)
    fields = dict(
        camera_ns=cam_t,
        # The frame's brightness encodes its index, to check frames land where they belong.
        camera_data=[jpeg(8 * (i % 30)) for i in range(len(cam_t))],
        camera_format="jpeg",
        pose_ns=pose_t,
        position=truth_position(pose_s),
        quaternion=truth_rotation(pose_s).as_quat(),
        width_ns=width_t,
        width=0.08 - 0.02 * (width_t - T0) / 1e9,
        truncated=None,
    )
    fields.update(overrides)
    return Streams.of_one_gripper(**fields)


def test_pose_and_width_are_interpolated_at_each_camera_capture_time() -> None:
    streams = make_streams()
    ep = build_episode(streams, CONFIG)

    t_s = (ep.capture_ns - T0) / 1e9
    assert np.abs(ep.eef_pos - truth_position(t_s)).max() < 1e-4
    angle = (truth_rotation(t_s).inv() * Rotation.from_rotvec(ep.eef_rot_axis_angle)).magnitude()
    assert np.degrees(angle).max() < 0.05
    assert np.abs(ep.gripper_width[:, 0] - (0.08 - 0.02 * t_s)).max() < 1e-6
    assert measured_frequency(ep.capture_ns) == pytest.approx(30.0, rel=0.005)
    assert ep.rgb.shape == (len(ep.capture_ns), 24, 32, 3) and ep.rgb.dtype == np.uint8


def test_the_recorded_samples_covering_the_kept_frames_are_kept() -> None:
    streams = make_streams()
    ep = build_episode(streams, CONFIG)
    for kept, recorded in ((ep.pose_ns, streams.pose_ns), (ep.width_ns, streams.width_ns)):
        # From the last sample at or before the first frame to the first at or after the last one.
        assert kept[0] <= ep.capture_ns[0] < kept[1] and kept[-2] < ep.capture_ns[-1] <= kept[-1]
        start = int(np.searchsorted(recorded, kept[0]))
        assert np.array_equal(recorded[start : start + len(kept)], kept)  # every sample in between
    t_s = (ep.pose_ns - T0) / 1e9
    np.testing.assert_allclose(ep.pose_position, truth_position(t_s), atol=1e-12)
    assert (truth_rotation(t_s).inv() * Rotation.from_rotvec(ep.pose_rot_axis_angle)).magnitude().max() < 1e-9
    np.testing.assert_allclose(ep.width_values, 0.08 - 0.02 * (ep.width_ns - T0) / 1e9, atol=1e-12)


def test_frames_outside_pose_span_are_trimmed_never_extrapolated() -> None:
    streams = make_streams(camera_offset_s=-0.5)  # camera starts 0.5 s before the first pose
    ep = build_episode(streams, CONFIG)
    assert ep.capture_ns[0] >= T0
    assert ep.dropped["outside_pose_or_width_span"] == 15


def test_out_of_order_and_duplicate_camera_messages_land_in_time_order() -> None:
    streams = make_streams()
    order = np.arange(len(streams.camera_ns))
    order[[10, 11]] = order[[11, 10]]  # written out of order
    order = np.append(order, 20)  # and one duplicate
    streams = make_streams(
        camera_ns=streams.camera_ns[order], camera_data=[streams.camera_data[i] for i in order]
    )

    ep = build_episode(streams, CONFIG)

    assert np.all(np.diff(ep.capture_ns) > 0)
    assert ep.dropped == {"duplicate_timestamp": 1}
    index = np.round((ep.capture_ns - T0 - 0.1e9) * 30 / 1e9).astype(int)
    brightness = ep.rgb.reshape(len(ep.rgb), -1).mean(axis=1)
    assert np.allclose(brightness, 8 * (index % 30), atol=2)  # each frame at its own time


def test_undecodable_frames_are_dropped_and_counted_until_too_many() -> None:
    streams = make_streams()
    data = list(streams.camera_data)
    data[5] = b"\xff\xd8 not a jpeg"
    ep = build_episode(make_streams(camera_data=data), ConvertConfig(image_size=(32, 24), min_frames=5))
    assert ep.dropped == {"undecodable": 1} and len(ep.capture_ns) == len(data) - 1

    for i in range(0, 30, 3):
        data[i] = b"garbage"
    with pytest.raises(RecordingError) as info:
        build_episode(make_streams(camera_data=data), CONFIG)
    assert info.value.reason == "undecodable_frames" and "max_undecodable_fraction" in str(info.value)


@pytest.mark.parametrize("damage", ["nan", "non_unit", "jump"])
def test_tracking_loss_trims_to_longest_clean_span_or_excludes(damage: str) -> None:
    streams = make_streams()
    pos, quat = streams.position.copy(), streams.quaternion.copy()
    k = 60  # 0.4 s in: the clean span after it is the longer one
    if damage == "nan":
        pos[k] = np.nan
    elif damage == "non_unit":
        quat[k] *= 1.5
    else:
        pos[k:] += 1.0  # 1 m in one sample: no hand moves like that
    streams = make_streams(position=pos, quaternion=quat)

    ep = build_episode(streams, CONFIG)
    assert ep.capture_ns[0] > streams.pose_ns[k - 1]
    assert ep.dropped["tracking_loss"] > 0 and any("tracking loss" in w for w in ep.warnings)

    with pytest.raises(RecordingError) as info:
        build_episode(streams, ConvertConfig(image_size=(32, 24), min_frames=5, on_tracking_loss="exclude"))
    assert info.value.reason == "tracking_loss"


def test_clean_span_prefers_the_longest_run() -> None:
    t = np.arange(10, dtype=np.int64) * 10_000_000
    pos = np.zeros((10, 3))
    pos[3] = np.nan
    quat = np.tile([0, 0, 0, 1.0], (10, 1))
    span, problems, *_ = clean_pose_span(t, pos, quat, ConvertConfig())
    assert (span.start, span.stop) == (4, 10) and problems == 1


def test_too_short_is_excluded_with_the_param_to_change() -> None:
    with pytest.raises(RecordingError) as info:
        build_episode(make_streams(seconds=0.1), ConvertConfig(image_size=(32, 24), min_frames=32))
    assert info.value.reason == "too_short" and "min_frames" in str(info.value)


def test_pose_slower_than_camera_is_interpolated() -> None:
    ep = build_episode(make_streams(pose_hz=10.0), CONFIG)
    t_s = (ep.capture_ns - T0) / 1e9
    # Linear interpolation of a smooth curve between 10 Hz samples: close, not exact.
    assert np.abs(ep.eef_pos - truth_position(t_s)).max() < 5e-4


def test_resampling_puts_every_episode_on_one_grid() -> None:
    ep = build_episode(make_streams(), ConvertConfig(image_size=(32, 24), min_frames=5, resample_hz=10.0))
    assert set(np.diff(ep.capture_ns)) == {100_000_000}
    t_s = (ep.capture_ns - T0) / 1e9
    assert np.abs(ep.eef_pos - truth_position(t_s)).max() < 1e-4


def test_resampling_keeps_each_frame_with_the_pose_of_its_own_capture_time() -> None:
    # A camera 7 ms off the 10 Hz grid: the nearest frames are kept at their capture times.
    streams = make_streams()
    streams = make_streams(
        camera_ns=streams.camera_ns + np.where(np.arange(len(streams.camera_ns)) % 2, 7_000_000, 0)
    )
    ep = build_episode(streams, ConvertConfig(image_size=(32, 24), min_frames=5, resample_hz=10.0))
    assert set(ep.capture_ns.tolist()) <= set(
        streams.camera_ns.tolist()
    )  # real capture times, not grid times
    brightness = ep.rgb[:, 0, 0, 0].astype(int)
    index = np.searchsorted(streams.camera_ns, ep.capture_ns)
    assert np.all(np.abs(brightness - 8 * (index % 30)) <= 2)  # the image of that very frame
    t_s = (ep.capture_ns - T0) / 1e9
    assert np.abs(ep.eef_pos - truth_position(t_s)).max() < 1e-4
    assert ep.resample_offset_ns.max() == 7_000_000


# ---------------------------------------------------------------- damaged and large camera frames


def test_empty_still_frame_is_undecodable_not_an_exception() -> None:
    streams = make_streams()
    data = list(streams.camera_data)
    data[5] = b""  # a zero-length message: cv2.imdecode asserts on it
    ep = build_episode(make_streams(camera_data=data), CONFIG)
    assert ep.dropped == {"undecodable": 1} and len(ep.capture_ns) == len(data) - 1
    assert streams.camera_ns[5] not in ep.capture_ns


def h264_packets(count: int, size: tuple[int, int] = (64, 48)) -> list[bytes]:
    """One Annex B packet per frame, an IDR every 10 frames (the encoder's keyint is 1 s of its
    clock: 10 Hz). Every frame differs from the last (brightness and a moving bar), so a frame
    decoded against the wrong reference shows it."""
    w, h = size
    encoder = _H264Encoder(size, 10.0, "ultrafast")
    packets = []
    for i in range(count):
        bgr = np.full((h, w, 3), 8 * (i % 30), np.uint8)
        bgr[:, (5 * i) % w] = 255
        bgr[(3 * i) % h, :, 1] = 0
        packets.append(encoder.encode(bgr))
    encoder.close()
    return packets


def plain_decode(packets: list[bytes]) -> dict[int, np.ndarray]:
    """Packet index -> what a decoder makes of it, with no idea which references were lost."""
    codec = av.CodecContext.create("h264", "r")
    frames = {}
    for index, data in enumerate([*packets, None]):
        packet = None if data is None else av.Packet(data)
        if packet is not None:
            packet.pts = index
        try:
            frames |= {int(f.pts): f.to_ndarray(format="rgb24") for f in codec.decode(packet)}
        except av.error.InvalidDataError:
            pass
    return frames


def h264_streams(packets: list[bytes], camera_ns: np.ndarray) -> Streams:
    return make_streams(camera_ns=camera_ns, camera_data=packets, camera_format="h264")


@pytest.mark.parametrize(
    ("lost", "reference_lost"),
    [([23], list(range(24, 30))), ([29], []), ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])],
    ids=["mid-gop", "just-before-idr", "stream-starts-mid-gop"],
)
def test_h264_frames_after_a_lost_packet_are_dropped_until_the_next_keyframe(
    lost: list[int], reference_lost: list[int]
) -> None:
    """Frames decoded against a lost reference are dropped and counted; the others are the
    very frames of the loss-free stream."""
    packets = h264_packets(60)
    camera_ns = make_streams().camera_ns
    whole = build_episode(h264_streams(packets, camera_ns), CONFIG)
    assert whole.dropped == {} and len(whole.capture_ns) == 60
    kept = np.setdiff1d(np.arange(60), lost)

    ep = build_episode(h264_streams([packets[i] for i in kept], camera_ns[kept]), CONFIG)

    assert ep.dropped == ({"h264_reference_lost": len(reference_lost)} if reference_lost else {})
    # Seen in the bitstream, not in the clock: the same loss with no gap in the capture times.
    closed = build_episode(h264_streams([packets[i] for i in kept], camera_ns[: len(kept)]), CONFIG)
    assert closed.dropped == ep.dropped
    good = np.setdiff1d(kept, reference_lost)
    assert np.array_equal(ep.capture_ns, camera_ns[good])
    assert np.array_equal(ep.rgb, whole.rgb[good])
    # The test means something: what was dropped really did decode wrong (when it decoded at all).
    truth, damaged = plain_decode(packets), plain_decode([packets[i] for i in kept])
    damaged = {int(kept[k]): frame for k, frame in damaged.items()}
    assert all(not np.array_equal(damaged[i], truth[i]) for i in reference_lost if i in damaged)


@pytest.mark.parametrize(
    "damage",
    [
        lambda packet: b"",
        lambda packet: b"\x00\x00\x01\x41" + bytes(range(256)) * 4,
        lambda packet: packet[:8],
    ],
    ids=["empty", "garbage-slice", "truncated-slice"],
)
def test_bad_h264_packet_is_one_undecodable_frame_and_the_gop_after_it_is_dropped(
    damage: Callable[[bytes], bytes],
) -> None:
    """An empty packet must never reach the decoder: it means "end of stream" and would end
    the decoding of every later frame. Garbage never reaches it either; a slice whose header
    reads but whose data the decoder fails on does, and the frames after it are suspect."""
    packets = h264_packets(60)
    packets[23] = damage(packets[23])
    camera_ns = make_streams().camera_ns

    ep = build_episode(h264_streams(packets, camera_ns), CONFIG)

    assert ep.dropped == {"undecodable": 1, "h264_reference_lost": 6}
    assert any("next keyframe" in w for w in ep.warnings)
    good = np.setdiff1d(np.arange(60), range(23, 30))
    assert np.array_equal(ep.capture_ns, camera_ns[good])
    assert np.array_equal(ep.rgb, build_episode(h264_streams(h264_packets(60), camera_ns), CONFIG).rgb[good])


def full_then_resize(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The reference: the whole frame in RGB, then resized (area to shrink, linear to enlarge)."""
    if rgb.shape[1::-1] == size:
        return rgb
    return cv2.resize(
        rgb, size, interpolation=cv2.INTER_AREA if rgb.shape[1] >= size[0] else cv2.INTER_LINEAR
    )


@pytest.mark.parametrize("size", [(32, 24), (64, 48), (100, 70)], ids=["shrink", "same", "enlarge"])
def test_frames_are_the_full_resolution_decode_resized(size: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    images = [
        cv2.GaussianBlur(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), (5, 5), 0) for _ in range(3)
    ]
    config = ConvertConfig(image_size=size, min_frames=2)
    stills = make_streams(
        camera_ns=make_streams().camera_ns[:3],
        camera_data=[cv2.imencode(".jpg", i)[1].tobytes() for i in images],
    )
    ep = build_episode(stills, config)
    assert len(ep.rgb) == 3
    for data, got in zip(stills.camera_data, ep.rgb):
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert np.array_equal(got, full_then_resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), size))

    packets = h264_packets(12)
    ep = build_episode(h264_streams(packets, make_streams().camera_ns[:12]), config)
    assert np.array_equal(
        ep.rgb, np.stack([full_then_resize(f, size) for f in plain_decode(packets).values()])
    )


def test_still_frames_are_decoded_and_resized_one_at_a_time() -> None:
    """Peak memory while decoding 12 large JPEGs stays under two full-resolution frames, not 12
    (tracemalloc sees numpy's buffers, which hold every image OpenCV decodes)."""
    w, h, count = 1600, 1200, 12
    y, x = np.indices((h, w))
    image = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    data = [cv2.imencode(".jpg", np.roll(image, 16 * i, axis=1))[1].tobytes() for i in range(count)]
    streams = make_streams(camera_ns=make_streams().camera_ns[:count], camera_data=data)

    tracemalloc.start()
    try:
        ep = build_episode(streams, ConvertConfig(image_size=(96, 96), min_frames=2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert ep.dropped == {} and len(ep.rgb) == count
    assert peak < 2 * w * h * 3, f"peak {peak / (w * h * 3):.1f} full-resolution frames"


class LiveArrays:
    """How many of the arrays it was shown are alive now, and the most ever alive at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def track(self, array: np.ndarray) -> np.ndarray:
        self.now += 1
        self.most = max(self.most, self.now)
        weakref.finalize(array, self._died)
        return array

    def _died(self) -> None:
        self.now -= 1


class CountingDecoder:
    """PyAV's H.264 decoder whose frames' full-resolution RGB arrays are tracked: tracemalloc
    cannot see them (`to_ndarray` returns a view of a buffer libav allocated)."""

    def __init__(self, codec: av.CodecContext, live: LiveArrays) -> None:
        self._codec, self._live = codec, live

    @property
    def thread_count(self) -> int:
        return self._codec.thread_count

    @thread_count.setter
    def thread_count(self, value: int) -> None:
        self._codec.thread_count = value

    def decode(self, packet: av.Packet | None = None) -> list[CountingFrame]:
        return [CountingFrame(frame, self._live) for frame in self._codec.decode(packet)]


class CountingFrame:
    def __init__(self, frame: av.VideoFrame, live: LiveArrays) -> None:
        self._frame, self._live, self.pts = frame, live, frame.pts

    def to_ndarray(self, **options) -> np.ndarray:
        return self._live.track(self._frame.to_ndarray(**options))


def test_h264_frames_are_decoded_and_resized_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    live = LiveArrays()
    create = lambda codec, mode: CountingDecoder(av.CodecContext.create(codec, mode), live)  # noqa: E731
    monkeypatch.setattr(
        episode,
        "av",
        types.SimpleNamespace(
            CodecContext=types.SimpleNamespace(create=create), Packet=av.Packet, error=av.error
        ),
    )
    count = 12
    streams = h264_streams(h264_packets(count, (640, 480)), make_streams().camera_ns[:count])

    ep = build_episode(streams, ConvertConfig(image_size=(96, 96), min_frames=2))

    assert ep.dropped == {} and len(ep.rgb) == count
    assert live.most == 1, f"{live.most} full-resolution frames alive at once"


def test_an_h264_stream_without_any_usable_keyframe_is_excluded_saying_why() -> None:
    packets = h264_packets(20)
    camera_ns = make_streams().camera_ns[:20]
    idr_free = [p for i, p in enumerate(packets) if i % 10]  # every IDR packet lost
    with pytest.raises(RecordingError) as failure:
        build_episode(h264_streams(idr_free, camera_ns[: len(idr_free)]), CONFIG)
    assert failure.value.reason == "h264_no_keyframe" and "IDR" in str(failure.value)


@pytest.mark.parametrize(
    ("offset_s", "says"), [(3600.0, "starts 3597.733 s after"), (-3600.0, "ends 3598.0")]
)
def test_camera_on_another_clock_says_the_spans_do_not_overlap_and_by_how_much(offset_s, says) -> None:
    # Excluded as `too_short: 0 usable frames` before: true, and no help in finding the clock.
    with pytest.raises(RecordingError) as info:
        build_episode(make_streams(camera_offset_s=offset_s), CONFIG)
    assert info.value.reason == "no_time_overlap"
    assert "no camera frame lies within the pose and width time span" in str(info.value)
    assert says in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("shifts_s", "says"),
    [
        ((0.0, 3600.0), "gripper 1: the camera ends 3598.9"),  # gripper 1 on another clock
        # Each overlaps the camera, not each other.
        ((0.5, -0.9), "gripper 0's pose and width begin after gripper 1's end"),
    ],
)
def test_with_two_grippers_no_time_overlap_names_the_gripper(shifts_s, says) -> None:
    # Gripper 0's spans alone were given before, whichever gripper was off.
    streams = make_streams(seconds=1.0)
    recorded = streams.grippers[0]
    for i, shift_s in enumerate(shifts_s):
        shift = round(shift_s * 1e9)
        streams.grippers[i] = dataclasses.replace(
            recorded, pose_ns=recorded.pose_ns + shift, width_ns=recorded.width_ns + shift
        )
    with pytest.raises(RecordingError) as info:
        build_episode(streams, CONFIG)
    assert info.value.reason == "no_time_overlap"
    message = str(info.value)
    assert "every gripper's pose and width time span" in message and says in message, message
    assert "gripper 0's pose +0.000" in message and "gripper 1's width" in message, message


def test_an_exclusion_names_the_files_damage_which_may_be_why_too_little_is_left() -> None:
    streams = make_streams(
        seconds=0.1,
        truncated="cut at byte 4096",
        damage=["chunk at byte 900: CRC mismatch, lost 12 messages"],
    )
    with pytest.raises(RecordingError) as info:
        build_episode(streams, ConvertConfig(image_size=(32, 24), min_frames=32))
    assert info.value.reason == "too_short"
    assert str(info.value).endswith(
        "; the file is damaged: truncated: cut at byte 4096; "
        "chunk at byte 900: CRC mismatch, lost 12 messages"
    )


@pytest.mark.parametrize("scale", [3.0, 0.3, 1e-3, 1e-6])
def test_pose_interpolator_orientations_are_scipy_slerp_bit_for_bit(scale: float) -> None:
    """PoseInterpolator writes Slerp's quaternion product out in NumPy (scipy 1.17's is slow): the
    orientations must stay the same bits, so convert's frames and the statistics do not move."""
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(0.001, 0.02, 2000))
    rotations = Rotation.from_rotvec(np.cumsum(rng.normal(0, scale, (2000, 3)), axis=0))
    interpolator = PoseInterpolator(t, rng.normal(size=(2000, 3)), rotations)
    x = np.concatenate([rng.uniform(t[0], t[-1], 50_000), t])  # between samples, and at each one
    np.testing.assert_array_equal(interpolator(x)[1].as_quat(), Slerp(t, rotations)(x).as_quat())
    with pytest.raises(ValueError, match="within"):
        interpolator(np.array([t[-1] + 1e-6]))
