"""The sample export: the format of recording-format.md, exact ground truth, determinism,
defects under their contract names, and a task a camera-conditioned policy can learn."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorSet
from mcap.reader import NonSeekingReader, make_reader
from mcap_protobuf.decoder import DecoderFactory
from scipy.spatial.transform import Rotation

from policypipe.synthetic import export as sample_export
from policypipe.synthetic.export import DEFECT_NAMES, SampleConfig, write_sample_export
from policypipe.synthetic.ground_truth import RecordingDraws
from policypipe.synthetic.motion import PersonsHand, plan_motion
from policypipe.synthetic.recording import (
    StreamTiming,
    random_timing,
    simulate_recording,
    write_raw_mcap,
    write_simulated_vio,
    write_vio_mcap,
)
from policypipe.synthetic.render import read_timecode, render_frame, timecode_value

MCAP_MAGIC = b"\x89MCAP0\r\n"
SMALL = dict(image_width=96, image_height=72)
START_NS = 1_793_000_000_000_000_000


# --- helpers -------------------------------------------------------------------------------


def tree_sha256(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def read_mcap(path: Path) -> list[dict]:
    """Every message in file order: topic, schema, encodings, log time, decoded content.
    Protobuf is decoded from the schema stored in the file (not from our own classes)."""
    factory = DecoderFactory()
    out = []
    with open(path, "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=False):
            if channel.message_encoding == "json":
                content = json.loads(message.data)
            else:
                content = factory.decoder_for(channel.message_encoding, schema)(message.data)
            out.append(
                {
                    "topic": channel.topic,
                    "schema": schema.name if schema else None,
                    "schema_encoding": schema.encoding if schema else None,
                    "message_encoding": channel.message_encoding,
                    "log_time": message.log_time,
                    "msg": content,
                    "schema_data": schema.data if schema else b"",
                }
            )
    return out


def capture_ns(m: dict) -> int:
    msg = m["msg"]
    if isinstance(msg, dict):
        return msg["stamp_ns"]
    return msg.timestamp.seconds * 1_000_000_000 + msg.timestamp.nanos


def on(messages: list[dict], topic: str) -> list[dict]:
    return [m for m in messages if m["topic"] == topic]


def red_mask(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(int) for i in range(3))
    return (r > 120) & (r - g > 60) & (r - b > 60)


def jpeg_roundtrip(rgb: np.ndarray, quality: int = 80) -> np.ndarray:
    ok, data = cv2.imencode(".jpg", np.ascontiguousarray(rgb[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1]


def decode_h264_one_by_one(payloads: list[bytes]) -> list[np.ndarray]:
    """Feeds one message at a time; each must give exactly one picture right away."""
    decoder = av.CodecContext.create("h264", "r")
    decoder.thread_count = 1  # frame threading would hold pictures back
    frames = []
    for i, data in enumerate(payloads):
        pictures = decoder.decode(av.Packet(data))
        assert len(pictures) == 1, f"message {i} decoded to {len(pictures)} pictures"
        frames.append(pictures[0].to_ndarray(format="rgb24"))
    return frames


def nal_types(annex_b: bytes) -> list[int]:
    return [annex_b[m.end()] & 0x1F for m in re.finditer(b"\x00\x00\x01", annex_b)]


# --- fixtures ------------------------------------------------------------------------------

CONFIG = SampleConfig(recordings=3, seed=5, **SMALL)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> sample_export.SampleExport:
    return write_sample_export(tmp_path_factory.mktemp("sample") / "export", CONFIG, workers=2)


# --- config and out_dir ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "mentions"),
    [
        ({"recordings": 0}, "recordings"),
        ({"seed": -1}, "seed"),
        ({"camera": "lidar"}, "camera"),
        ({"task": ""}, "task"),
        ({"task": "../up"}, "task"),
        ({"image_width": 95}, "image_width"),
        ({"image_height": 32}, "image_height"),
        ({"recovery": 1.5}, "recovery"),
        ({"hand": -0.1}, "hand"),
        ({"hand": 0.5, "grippers": 2}, "hand"),
    ],
)
def test_config_that_cannot_work_is_refused_with_what_to_change(change: dict, mentions: str) -> None:
    with pytest.raises(ValueError, match=mentions):
        SampleConfig(**change)


def test_timing_that_would_break_monotonic_timestamps_is_refused() -> None:
    with pytest.raises(ValueError, match="camera_jitter_s"):
        StreamTiming(camera_jitter_s=0.01)


def test_a_non_empty_out_dir_is_refused_and_left_untouched(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty"):
        write_sample_export(out, SampleConfig(recordings=1, defects=False, **SMALL))
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FileExistsError, match="not a folder"):
        write_sample_export(tmp_path / "a_file", SampleConfig(recordings=1, defects=False, **SMALL))


def test_an_empty_out_dir_is_filled(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    result = write_sample_export(out, SampleConfig(recordings=1, defects=False, **SMALL), workers=1)
    assert result.good_stems == ("rec_0001",) and result.defects == {}
    assert sorted(tree_sha256(out)) == [
        "session_01/rec_0001.mcap",
        "session_01/rec_0001_vio.json",
        "session_01/rec_0001_vio.mcap",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temporary folder left


def test_a_failed_run_leaves_no_export_and_no_temporary_folder(tmp_path: Path, monkeypatch) -> None:
    real_run_job = sample_export._run_job

    def crash_on_second(root: str, job):
        if job.index == 1:
            raise RuntimeError("killed")
        return real_run_job(root, job)

    monkeypatch.setattr(sample_export, "_run_job", crash_on_second)
    with pytest.raises(RuntimeError, match="killed"):
        write_sample_export(
            tmp_path / "export", SampleConfig(recordings=2, defects=False, **SMALL), workers=1
        )
    assert list(tmp_path.iterdir()) == []


# --- determinism ---------------------------------------------------------------------------


def test_same_config_writes_byte_identical_files_whatever_the_worker_count(export, tmp_path: Path) -> None:
    again = write_sample_export(tmp_path / "again", CONFIG, workers=1)
    assert tree_sha256(again.root) == tree_sha256(export.root)
    assert (again.good_stems, again.defects, again.files, again.bytes) == (
        export.good_stems,
        export.defects,
        export.files,
        export.bytes,
    )


def test_another_seed_writes_other_recordings(export, tmp_path: Path) -> None:
    other = write_sample_export(
        tmp_path / "other", SampleConfig(recordings=3, seed=6, defects=False, **SMALL)
    )
    ours, theirs = tree_sha256(export.root), tree_sha256(other.root)
    for rel, digest in theirs.items():
        assert ours[rel] != digest, rel


# --- layout and status files -----------------------------------------------------------------


def test_every_file_is_a_good_triplet_or_a_listed_defect(export) -> None:
    files = set(tree_sha256(export.root))
    good = {
        f"session_01/{stem}{suffix}"
        for stem in export.good_stems
        for suffix in (".mcap", "_vio.mcap", "_vio.json")
    }
    listed = {path for paths in export.defects.values() for path in paths}
    assert good <= files and good.isdisjoint(listed)
    assert good | listed == files
    assert export.files == len(files)
    assert export.bytes == sum((export.root / rel).stat().st_size for rel in files)


def test_good_status_files_say_success_and_count_the_frames(export) -> None:
    for stem in export.good_stems:
        folder = export.root / "session_01"
        status = json.loads((folder / f"{stem}_vio.json").read_text())
        assert status["source"] == f"{stem}.mcap" and status["output"] == f"{stem}_vio.mcap"
        assert (status["status"], status["error"], status["task"]) == ("success", None, "pick_place")
        assert status["studio_version"] == "2.4.1"
        # Processed after the recording, on the seed's fixed date (never the wall clock).
        assert status["started_at"] < status["finished_at"]
        assert status["started_at"].startswith("2026-11-08T09:")  # seed 5: five days after 2026-11-03
        cameras = on(read_mcap(folder / f"{stem}_vio.mcap"), "/camera0/image")
        assert status["frames"] == len(cameras) > 150


# --- inside S_vio.mcap -------------------------------------------------------------------------


def test_good_recordings_have_the_topics_schemas_and_encodings_of_the_contract(export) -> None:
    expected = {
        "/camera0/image": ("foxglove.CompressedImage", "protobuf", "protobuf"),
        "/vio/pose": ("foxglove.PoseInFrame", "protobuf", "protobuf"),
        "/gripper/width": ("GripperWidth", "jsonschema", "json"),
    }
    for stem in export.good_stems:
        messages = read_mcap(export.root / "session_01" / f"{stem}_vio.mcap")
        channels = {m["topic"]: (m["schema"], m["schema_encoding"], m["message_encoding"]) for m in messages}
        assert {t: channels[t] for t in expected} == expected
        assert set(channels) - set(expected) <= {"/diagnostics"}  # extra channels are allowed
        # Self-contained FileDescriptorSets: the message's file and all it imports.
        for topic, proto in (("/camera0/image", "CompressedImage"), ("/vio/pose", "PoseInFrame")):
            fds = FileDescriptorSet.FromString(on(messages, topic)[0]["schema_data"])
            names = {f.name for f in fds.file}
            assert {f"foxglove/{proto}.proto", "google/protobuf/timestamp.proto"} <= names
            assert all(dep in names for f in fds.file for dep in f.dependency)
        image = on(messages, "/camera0/image")[0]["msg"]
        assert (image.format, image.frame_id) == ("jpeg", "camera0")
        assert image.data[:2] == b"\xff\xd8"  # JPEG SOI
        pose = on(messages, "/vio/pose")[0]["msg"]
        assert pose.frame_id == "world"
        q = [
            pose.pose.orientation.x,
            pose.pose.orientation.y,
            pose.pose.orientation.z,
            pose.pose.orientation.w,
        ]
        assert abs(np.linalg.norm(q) - 1.0) < 1e-6
        width = on(messages, "/gripper/width")[0]["msg"]
        assert set(width) == {"stamp_ns", "width_m"} and 0.07 < width["width_m"] < 0.09  # starts open


def test_timestamps_are_capture_times_on_realistic_clocks(export) -> None:
    out_of_order = 0
    first_stamps = []
    for stem in export.good_stems:
        messages = read_mcap(export.root / "session_01" / f"{stem}_vio.mcap")
        stamps = {
            t: np.array([capture_ns(m) for m in on(messages, t)])
            for t in ("/camera0/image", "/vio/pose", "/gripper/width")
        }
        for topic, t in stamps.items():  # in file order, so also in log_time order
            assert np.all(np.diff(t) > 0), f"{stem} {topic}: capture times not strictly increasing"
        camera_dt = np.diff(stamps["/camera0/image"]) / 1e9
        assert abs(np.median(camera_dt) - 1 / 30) < 0.002  # ~30 Hz ...
        assert camera_dt.std() > 1e-4  # ... with jitter ...
        assert camera_dt.max() > 1.5 / 30  # ... and dropped frames
        pose_hz = 1e9 / np.median(np.diff(stamps["/vio/pose"]))
        width_hz = 1e9 / np.median(np.diff(stamps["/gripper/width"]))
        assert 115 <= pose_hz <= 205 and 40 <= width_hz <= 50
        first_stamps.append([t[0] for t in stamps.values()])
        # log_time is when the logger wrote it: later than the capture, and not always in order.
        lag = np.array([m["log_time"] - capture_ns(m) for m in messages if m["topic"] in stamps])
        assert lag.min() > 0 and lag.max() < 100_000_000
        log_times = np.array([m["log_time"] for m in messages])
        out_of_order += int(np.sum(np.diff(log_times) < 0))
    assert out_of_order > 0
    # Streams start at different moments (up to a few hundred ms apart).
    spreads = [(max(s) - min(s)) / 1e9 for s in first_stamps]
    assert max(spreads) > 0.01 and max(spreads) < 0.5


def test_raw_recording_holds_camera_and_imu(export) -> None:
    stem = export.good_stems[0]
    messages = read_mcap(export.root / "session_01" / f"{stem}.mcap")
    assert {m["topic"] for m in messages} == {"/camera0/video", "/imu"}
    imu = [m["msg"] for m in on(messages, "/imu")]
    assert 190 <= 1e9 / np.median(np.diff([m["stamp_ns"] for m in imu])) <= 210
    # Gravity dominates the specific force of a hand-held device pointing down.
    accel = np.array([m["accel_mps2"] for m in imu])
    assert 9.0 < np.median(np.linalg.norm(accel, axis=1)) < 10.6
    status = json.loads((export.root / "session_01" / f"{stem}_vio.json").read_text())
    assert len(on(messages, "/camera0/video")) == status["frames"]


# --- ground truth, through the lower-level API -------------------------------------------------


@pytest.mark.parametrize(
    "variation",
    [
        dict(compression="zstd", chunked=True, summary=True),
        dict(compression="lz4", chunked=True, summary=False),
        dict(compression="none", chunked=False, summary=True),
        dict(compression="none", chunked=False, summary=False),
    ],
)
def test_written_values_are_the_plan_evaluated_at_the_written_timestamps(
    tmp_path: Path, variation: dict
) -> None:
    rng = np.random.default_rng(11)
    plan = plan_motion(rng, START_NS, duration_s=3.0)
    timing = StreamTiming(pose_hz=180.0, camera_drop_fraction=0.05, pose_start_s=0.2, width_stop_s=0.1)
    path = tmp_path / "r_vio.mcap"
    truth = write_vio_mcap(path, plan, timing, rng, image_size=(64, 48), **variation)

    assert path.read_bytes()[:8] == MCAP_MAGIC and path.read_bytes()[-8:] == MCAP_MAGIC
    messages = read_mcap(path)
    camera = np.array([capture_ns(m) for m in on(messages, "/camera0/image")])
    assert np.array_equal(camera, truth.camera_ns) and truth.frames == len(camera)
    nominal = round((plan.end_ns - plan.start_ns) / 1e9 * 30) + 1
    assert truth.frames + truth.dropped_frames in (nominal - 1, nominal) and truth.dropped_frames > 0

    poses = on(messages, "/vio/pose")
    pose_ns = np.array([capture_ns(m) for m in poses])
    assert np.array_equal(pose_ns, truth.pose_ns)
    assert pose_ns[0] >= plan.start_ns + 200_000_000 - 1_000_000  # pose starts late
    position, quat = plan.pose_at(pose_ns)
    written_p = np.array(
        [[m["msg"].pose.position.x, m["msg"].pose.position.y, m["msg"].pose.position.z] for m in poses]
    )
    o = [m["msg"].pose.orientation for m in poses]
    written_q = np.array([[q.x, q.y, q.z, q.w] for q in o])
    assert np.array_equal(written_p, position) and np.array_equal(written_q, quat)

    widths = on(messages, "/gripper/width")
    width_ns = np.array([m["msg"]["stamp_ns"] for m in widths])
    assert np.array_equal(width_ns, truth.width_ns)
    assert np.array_equal([m["msg"]["width_m"] for m in widths], plan.width_at(width_ns))


def test_png_frames_are_exactly_the_rendered_ground_truth(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    plan = plan_motion(rng, START_NS, duration_s=2.0)
    truth = write_vio_mcap(
        tmp_path / "p_vio.mcap", plan, StreamTiming(), rng, image_format="png", image_size=(64, 48)
    )
    images = on(read_mcap(tmp_path / "p_vio.mcap"), "/camera0/image")
    assert images[0]["msg"].format == "png"
    for m in images[:: len(images) // 4]:
        decoded = cv2.imdecode(np.frombuffer(m["msg"].data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
        assert np.array_equal(decoded, render_frame(plan, capture_ns(m), (64, 48)))
    assert len(images) == truth.frames


def test_motion_is_smooth_and_the_gripper_closes_on_the_target_and_opens_again() -> None:
    plan = plan_motion(np.random.default_rng(21), START_NS)
    assert 6.0 <= plan.duration_s <= 11.0
    t = np.arange(plan.start_ns, plan.end_ns, 5_000_000)  # 200 Hz
    position, quat = plan.pose_at(t)
    speed = np.linalg.norm(np.diff(position, axis=0), axis=1) / 0.005
    assert speed.max() < 1.0  # a hand, not a teleport
    assert np.all(np.einsum("ij,ij->i", quat[1:], quat[:-1]) > 0.999)  # no sign flips, no jumps
    down = Rotation.from_quat(quat).apply([0.0, 0.0, 1.0])  # the tool's approach axis
    assert np.all(down[:, 2] < -0.95)  # pointing down, small tilts
    width = plan.width_at(t)
    grasp, release = plan.events_ns["grasp"], plan.events_ns["release"]
    assert width[0] > 0.075 and width[-1] > 0.075
    held = (t > grasp) & (t < release)
    assert np.all((width[held] > 0.018) & (width[held] < 0.031))
    # The target leaves the table with the gripper and lands somewhere else.
    target, _ = plan.target_at(np.array([plan.start_ns, (grasp + release) // 2, plan.end_ns]))
    assert target[1, 2] > target[0, 2] + 0.05
    assert np.linalg.norm(target[2, :2] - target[0, :2]) > 0.1


# --- the camera: timecode, video, what it sees ---------------------------------------------------


def test_timecode_survives_jpeg_and_a_resize_to_64x48() -> None:
    plan = plan_motion(np.random.default_rng(4), START_NS)
    for t in np.linspace(plan.start_ns, plan.end_ns, 7).astype(np.int64):
        image = jpeg_roundtrip(render_frame(plan, int(t), (320, 240), timecode=True), quality=60)
        assert read_timecode(image) == timecode_value(int(t))
        for interpolation in (cv2.INTER_AREA, cv2.INTER_LINEAR):
            small = cv2.resize(image, (64, 48), interpolation=interpolation)
            assert read_timecode(small) == timecode_value(int(t))
    assert timecode_value(START_NS + 1_234_567_890) == (START_NS // 1_000_000 + 1234) % 2**20
    with pytest.raises(ValueError):
        read_timecode(render_frame(plan, plan.start_ns, (96, 72)))  # no strip drawn


def test_video_messages_are_single_h264_frames_with_timecodes(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    plan = plan_motion(rng, START_NS, duration_s=2.5)
    truth = write_vio_mcap(
        tmp_path / "v_vio.mcap", plan, StreamTiming(), rng, camera="video", timecode=True, image_size=(96, 72)
    )
    videos = on(read_mcap(tmp_path / "v_vio.mcap"), "/camera0/video")
    assert {(m["schema"], m["msg"].format, m["msg"].frame_id) for m in videos} == {
        ("foxglove.CompressedVideo", "h264", "camera0")
    }
    payloads = [m["msg"].data for m in videos]
    keyframes = [i for i, p in enumerate(payloads) if 5 in nal_types(p)]  # IDR slices
    assert keyframes[0] == 0 and 2 <= len(keyframes) <= 4  # about one per second
    assert all({7, 8} <= set(nal_types(payloads[i])) for i in keyframes)  # SPS and PPS with every IDR
    assert all(
        p.startswith(b"\x00\x00\x00\x01") or p.startswith(b"\x00\x00\x01") for p in payloads
    )  # Annex B
    frames = decode_h264_one_by_one(payloads)
    assert len(frames) == truth.frames
    for m, frame in zip(videos, frames):
        assert read_timecode(frame) == timecode_value(capture_ns(m))
        assert read_timecode(cv2.resize(frame, (64, 48), interpolation=cv2.INTER_AREA)) == timecode_value(
            capture_ns(m)
        )


def test_video_export_mode_writes_decodable_frames_that_show_the_target(tmp_path: Path) -> None:
    result = write_sample_export(
        tmp_path / "v", SampleConfig(recordings=1, camera="video", defects=False, **SMALL)
    )
    messages = read_mcap(result.root / "session_01" / "rec_0001_vio.mcap")
    assert "/camera0/image" not in {m["topic"] for m in messages}
    frames = decode_h264_one_by_one([m["msg"].data for m in on(messages, "/camera0/video")])
    status = json.loads((result.root / "session_01" / "rec_0001_vio.json").read_text())
    assert len(frames) == status["frames"]
    assert np.mean([red_mask(f).sum() > 5 for f in frames]) > 0.9


def test_target_is_visible_and_moves_in_the_image_as_the_gripper_approaches() -> None:
    plan = plan_motion(np.random.default_rng(5), START_NS)
    start = jpeg_roundtrip(render_frame(plan, plan.start_ns, (96, 72)))
    before_grasp = jpeg_roundtrip(render_frame(plan, plan.events_ns["grasp"] - 600_000_000, (96, 72)))
    far, near = red_mask(start), red_mask(before_grasp)
    assert far.sum() > 10 and near.sum() > 3 * far.sum()  # visible, and bigger when closer
    centroid_far = np.argwhere(far).mean(axis=0)
    centroid_near = np.argwhere(near).mean(axis=0)
    assert np.linalg.norm(centroid_near - centroid_far) > 5  # pixels
    assert centroid_near[0] > 72 / 2  # ends up low in the image, between the fingers


def test_where_the_target_appears_predicts_where_the_gripper_goes() -> None:
    """The point of the task: the camera sees what the hand does next. Across recordings,
    the target's horizontal offset in the first frame predicts the sideways motion (in the
    tool frame) to the grasp; the start pose alone does not (the target is random)."""
    offsets, sideways = [], []
    for seed in range(12):
        plan = plan_motion(np.random.default_rng(100 + seed), START_NS)
        mask = red_mask(jpeg_roundtrip(render_frame(plan, plan.start_ns, (96, 72))))
        offsets.append(np.argwhere(mask)[:, 1].mean() - 96 / 2)
        p, q = plan.pose_at(np.array([plan.start_ns, plan.events_ns["grasp"]]))
        sideways.append(Rotation.from_quat(q[0]).inv().apply(p[1] - p[0])[1])
    assert np.corrcoef(offsets, sideways)[0, 1] > 0.9
    assert np.std(sideways) > 0.02  # metres: the motion does vary from recording to recording


def test_simulated_recording_is_deterministic_given_its_seeds(tmp_path: Path) -> None:
    def write(name: str) -> bytes:
        rng = np.random.default_rng(9)
        plan = plan_motion(rng, START_NS, duration_s=2.0)
        rec = simulate_recording(plan, random_timing(rng), rng, camera="video", image_size=(64, 48))
        write_simulated_vio(tmp_path / name, rec)
        write_raw_mcap(
            tmp_path / f"raw_{name}", plan, StreamTiming(), np.random.default_rng(1), image_size=(64, 48)
        )
        return (tmp_path / name).read_bytes() + (tmp_path / f"raw_{name}").read_bytes()

    assert write("a.mcap") == write("b.mcap")


# --- defects -------------------------------------------------------------------------------------


def test_every_defect_is_present_under_its_contract_name(export) -> None:
    assert tuple(export.defects) == DEFECT_NAMES
    root = export.root
    stems = {
        name: {re.sub(r"(_vio)?( \(1\))?\.(mcap|json)(\.partial)?$", "", Path(p).name) for p in paths}
        for name, paths in export.defects.items()
    }
    for name, paths in export.defects.items():
        assert all((root / p).is_file() for p in paths), name
        if name not in ("retry_leftover", "partial_leftover"):
            assert stems[name].isdisjoint(export.good_stems), name

    def status(name: str) -> dict:
        (path,) = [p for p in export.defects[name] if p.endswith("_vio.json")]
        return json.loads((root / path).read_text())

    failed = status("status_failed")
    assert failed["status"] == "failed" and "lost tracking" in failed["error"]
    assert len(export.defects["missing_json"]) == 2 and not any(
        p.endswith(".json") for p in export.defects["missing_json"]
    )
    (empty,) = [p for p in export.defects["empty_vio"] if p.endswith("_vio.mcap")]
    assert (root / empty).stat().st_size == 0
    (retry,) = export.defects["retry_leftover"]
    (partial,) = export.defects["partial_leftover"]
    assert retry.endswith("_vio (1).mcap") and partial.endswith("_vio.mcap.partial")
    for leftover, suffix in ((retry, "_vio (1).mcap"), (partial, "_vio.mcap.partial")):
        stem = Path(leftover).name[: -len(suffix)]
        assert stem in export.good_stems
        assert (root / Path(leftover).parent / f"{stem}_vio.json").is_file()  # next to its good triplet
    assert status("other_task")["task"] not in ("pick_place", None)
    (bad_json,) = [p for p in export.defects["invalid_json"] if p.endswith(".json")]
    with pytest.raises(json.JSONDecodeError):
        json.loads((root / bad_json).read_text())
    assert status("source_outside")["source"] == "../x.mcap"
    duplicates = export.defects["duplicate_stem"]
    assert len(duplicates) == 6 and len(stems["duplicate_stem"]) == 1
    assert len({Path(p).parent for p in duplicates}) == 2
    (not_mcap,) = [p for p in export.defects["not_mcap"] if p.endswith("_vio.mcap")]
    assert (root / not_mcap).stat().st_size > 0 and not (root / not_mcap).read_bytes().startswith(MCAP_MAGIC)


def test_truncated_vio_is_a_real_recording_cut_mid_file(export) -> None:
    (vio,) = [export.root / p for p in export.defects["truncated_vio"] if p.endswith("_vio.mcap")]
    (status,) = [export.root / p for p in export.defects["truncated_vio"] if p.endswith("_vio.json")]
    data = vio.read_bytes()
    assert data.startswith(MCAP_MAGIC) and not data.endswith(MCAP_MAGIC)
    assert json.loads(status.read_text())["status"] == "success"
    # Read as a stream (there is no footer to seek to): what comes before the cut is real
    # data, fewer frames than the status claims, and then the reader hits the damage.
    frames = 0
    with pytest.raises(Exception), open(vio, "rb") as f:  # noqa: B017 - any reader error marks the cut
        for _, channel, _ in NonSeekingReader(f).iter_messages(log_time_order=False):
            frames += channel.topic == "/camera0/image"
    assert 0 < frames < json.loads(status.read_text())["frames"]


# --- recovery demonstrations -----------------------------------------------------------------


def test_a_recovery_demonstration_strays_and_corrects_in_the_same_scene() -> None:
    for seed in range(5):
        plain = plan_motion(np.random.default_rng(seed), START_NS)
        strayed = plan_motion(np.random.default_rng(seed), START_NS, recovery_rng=np.random.default_rng(seed))
        assert np.array_equal(plain.scene.target_xy, strayed.scene.target_xy)
        assert plain.scene.texture_seed == strayed.scene.texture_seed
        # The approach ends 3-7 cm off the plain plan's spot above the block, then corrects to it.
        off = np.linalg.norm(strayed.knot_position[2, :2] - plain.knot_position[2, :2])
        assert 0.03 <= off <= 0.07
        assert np.array_equal(strayed.knot_position[3], plain.knot_position[2])
        # It grasps where the plain plan grasps, with the fingers as closed, and releases there too.
        for moment in ("grasp", "release"):
            a, b = plain.events_ns[moment], strayed.events_ns[moment]
            np.testing.assert_allclose(
                strayed.pose_at(np.array([b]))[0][0], plain.pose_at(np.array([a]))[0][0], atol=0.006
            )
            assert strayed.width_at(np.array([b]))[0] == pytest.approx(plain.width_at(np.array([a]))[0])
        # Three corrections of 0.5-0.9 s, less 30 % of a 0.8-1.2 s descent.
        assert plain.duration_s + 1.14 < strayed.duration_s < plain.duration_s + 2.46


def test_recovery_demonstrations_change_only_the_recordings_that_stray(tmp_path: Path) -> None:
    config = SampleConfig(recordings=4, defects=False, **SMALL)
    plain = write_sample_export(tmp_path / "plain", config)
    mixed = write_sample_export(tmp_path / "mixed", SampleConfig(**{**config.__dict__, "recovery": 0.5}))
    frames = {
        name: {
            stem: json.loads(next(export.root.rglob(f"{stem}_vio.json")).read_text())["frames"]
            for stem in export.good_stems
        }
        for name, export in (("plain", plain), ("mixed", mixed))
    }
    strayed = [stem for stem in plain.good_stems if frames["mixed"][stem] != frames["plain"][stem]]
    assert 1 <= len(strayed) <= 3  # about half, drawn per recording
    assert all(frames["mixed"][stem] > frames["plain"][stem] + 30 for stem in strayed)
    for stem in set(plain.good_stems) - set(strayed):
        (a,), (b,) = (list(e.root.rglob(f"{stem}_vio.mcap")) for e in (plain, mixed))
        assert a.read_bytes() == b.read_bytes()


# --- a person's hand -------------------------------------------------------------------------


def test_a_persons_hand_grasps_off_centre_arrives_astray_and_corrects_in_the_same_scene() -> None:
    astray = 0
    for seed in range(12):
        plain = plan_motion(np.random.default_rng(seed), START_NS)
        hand = PersonsHand.draw(np.random.default_rng([5, seed]))
        person = plan_motion(np.random.default_rng(seed), START_NS, hand_rng=np.random.default_rng([5, seed]))
        assert np.array_equal(plain.scene.target_xy, person.scene.target_xy)
        assert plain.scene.texture_seed == person.scene.texture_seed
        # The fingers close square (within a degree, as the plain plans') at `along_m` from the
        # block's centre along them, and the held block's frames show it there, not at the TCP.
        grasp = np.array([person.events_ns["grasp"]])
        (tcp,), _ = person.pose_at(grasp)
        heading = person._heading(person._seconds(grasp))[0]
        off_square = (person.scene.target_yaw - heading + math.pi / 2) % math.pi - math.pi / 2
        assert abs(math.degrees(off_square)) < 1.2
        # The plan grasps `along_m` along the fingers from where the plain plan grasps (which is
        # within millimetres of the block's centre).
        grasp_knot = 4 if hand.arrives_astray else 3
        np.testing.assert_allclose(
            person.knot_position[grasp_knot] - plain.knot_position[3],
            [hand.along_m * math.cos(heading), hand.along_m * math.sin(heading), 0.0],
            atol=2e-4,
        )
        assert abs(hand.along_m) <= PersonsHand.ALONG_MAX_M
        along = np.dot(tcp[:2] - person.scene.target_xy, [math.cos(heading), math.sin(heading)])
        assert person.grip_offset_tool[0] == pytest.approx(-along, abs=0.002)
        assert person.grip_offset_tool[1] == 0.0
        held = np.array([(person.events_ns["grasp"] + person.events_ns["release"]) // 2])
        (centre,), _ = person.target_at(held)
        (tcp_held,), (quat_held,) = person.pose_at(held)
        np.testing.assert_allclose(
            centre, tcp_held + Rotation.from_quat(quat_held).apply(person.grip_offset_tool), atol=1e-6
        )
        if hand.arrives_astray:
            # The approach ends turned and off, the next knot is the plain plan's spot above the block.
            astray += 1
            turn = math.degrees(abs(person.knot_yaw[2] - person.knot_yaw[3]))
            off = np.linalg.norm(person.knot_position[2, :2] - person.knot_position[3, :2])
            assert turn == 0.0 or 10.0 <= turn <= 40.0
            assert off == 0.0 or 0.01 <= off <= 0.02
            assert turn > 0.0 or off > 0.0
            assert len(person.knot_s) == len(plain.knot_s) + 1
        else:
            assert len(person.knot_s) == len(plain.knot_s)
    assert 3 <= astray <= 9  # about half


def test_persons_hand_recordings_change_only_the_recordings_drawn_for_it(tmp_path: Path) -> None:
    config = SampleConfig(recordings=6, defects=False, **SMALL)
    plain = write_sample_export(tmp_path / "plain", config)
    mixed = write_sample_export(tmp_path / "mixed", SampleConfig(**{**config.__dict__, "hand": 0.5}))
    changed = [
        stem
        for stem in plain.good_stems
        if next(plain.root.rglob(f"{stem}_vio.mcap")).read_bytes()
        != next(mixed.root.rglob(f"{stem}_vio.mcap")).read_bytes()
    ]
    assert 1 <= len(changed) <= 5  # drawn per recording (seed 0: the first four)
    drawn = [
        stem
        for stem in plain.good_stems
        if RecordingDraws.of(config.seed, int(stem[4:]) - 1).hand.random() < 0.5
    ]
    assert changed == drawn
