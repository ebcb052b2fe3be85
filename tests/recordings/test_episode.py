"""Alignment and quality rules on hand-made streams with a known truth."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from policypipe.recordings.episode import ConvertConfig, build_episode, clean_pose_span, measured_frequency
from policypipe.recordings.streams import RecordingError, Streams

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
    cam_t = T0 + np.round((camera_offset_s + np.arange(int(seconds * camera_hz)) / camera_hz) * 1e9).astype(np.int64)
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
    return Streams(**fields)


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
    streams = make_streams(camera_ns=streams.camera_ns[order], camera_data=[streams.camera_data[i] for i in order])

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
