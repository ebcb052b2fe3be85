"""`policypipe predict` on the pipeline's own path: sample recordings converted by `convert`, an
untrained policy saved as the train stage saves it (tests/runtime/test_runner.py), and the
predictions MCAP read back with the mcap library, its protobuf decoded from the schemas in the file."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mcap.reader import make_reader
from mcap.writer import Writer
from mcap_protobuf.decoder import DecoderFactory

from policypipe.cli import main
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import decode_frames
from policypipe.recordings.streams import read_streams
from policypipe.runtime.observation import Observation
from policypipe.runtime.predictions import (
    EXECUTED_TOPIC,
    MONITOR_TOPIC,
    NOT_ARRIVED,
    PREDICTED_TOPIC,
    REFUSED,
    WIDTH_TOPIC,
    PredictConfig,
    PredictionError,
    RobotFeed,
    predict_recording,
)
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.export import SampleConfig, write_sample_export
from tests.runtime.test_runner import WINDOW, Pipeline, robot_observation


@pytest.fixture(scope="module")
def validation(pipeline: Pipeline) -> Path:
    """The _vio.mcap of the validation episode."""
    return pipeline.recordings[pipeline.stats["split"]["val"][0]]


@pytest.fixture(scope="module")
def predicted(pipeline: Pipeline, validation: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("predict") / "predictions.mcap"
    summary = predict_recording(pipeline.policy, validation, out, PredictConfig(seed=7))
    return out, summary


@pytest.fixture
def one_thread():
    """torch on one thread, as predict runs the policy by default: on another count a reduction adds
    in another order (the demo's policy: positions off by up to 1.2e-7 m between 1 and 2 threads)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def read_back(path: Path) -> dict:
    """Per topic, in file order: (schema name, schema encoding, message encoding, log time, decoded)."""
    factory = DecoderFactory()
    topics: dict[str, list] = {}
    with open(path, "rb") as f:
        reader = make_reader(f)
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            if channel.message_encoding == "json":
                content = json.loads(message.data)
            else:
                content = factory.decoder_for(channel.message_encoding, schema)(message.data)
            topics.setdefault(channel.topic, []).append(
                (schema.name, schema.encoding, channel.message_encoding, message.log_time, content)
            )
        f.seek(0)
        topics["metadata"] = {m.name: m.metadata for m in make_reader(f).iter_metadata()}
    return topics


def expected_times(vio: Path, every: int) -> tuple[list[int], int]:
    """The chunk times a robot asking every `every` frames gets, worked out from the streams alone:
    from the first frame with pose and width before it; a frame past the last pose or width sample
    gives no chunk, and the robot asks again at the next. Also the number of such frames asked in vain."""
    streams = read_streams(vio, ConvertConfig().topics)
    frames = np.unique(streams.camera_ns)  # sorted, as captured
    first = max(streams.pose_ns.min(), streams.width_ns.min())
    last = min(streams.pose_ns.max(), streams.width_ns.max())
    times, in_vain, i = [], 0, int(np.searchsorted(frames, first))
    while i < len(frames):
        if frames[i] <= last:
            times.append(int(frames[i]))
            i += every
        else:
            in_vain += 1
            i += 1
    return times, in_vain


def test_the_predictions_are_foxglove_messages_one_per_chunk_at_the_observation_times(
    pipeline: Pipeline, validation: Path, predicted
) -> None:
    out, summary = predicted
    topics = read_back(out)
    times, in_vain = expected_times(validation, WINDOW.n_action_steps)
    assert summary.chunks == len(times) == len(topics[PREDICTED_TOPIC]) > 10
    assert summary.observation_ns == times
    assert summary.skipped.get(NOT_ARRIVED, 0) == in_vain
    for topic in (PREDICTED_TOPIC, EXECUTED_TOPIC):
        assert {m[:3] for m in topics[topic]} == {("foxglove.PosesInFrame", "protobuf", "protobuf")}
        assert [m[3] for m in topics[topic]] == times  # logged at the observation's capture time
        assert [m[4].timestamp.ToNanoseconds() for m in topics[topic]] == times
        assert {m[4].frame_id for m in topics[topic]} == {"world"}
    assert {m[:3] for m in topics[WIDTH_TOPIC]} == {("policypipe.PredictedWidth", "jsonschema", "json")}
    for predicted_msg, executed, width in zip(
        *(topics[t] for t in (PREDICTED_TOPIC, EXECUTED_TOPIC, WIDTH_TOPIC))
    ):
        assert len(predicted_msg[4].poses) == WINDOW.horizon
        assert list(executed[4].poses) == list(predicted_msg[4].poses)[: WINDOW.n_action_steps]
        assert width[3] == width[4]["timestamp_ns"] == predicted_msg[3]
        assert width[4]["executed"] == [k < WINDOW.n_action_steps for k in range(WINDOW.horizon)]
        assert len(width[4]["width_m"]) == len(width[4]["time_ns"]) == WINDOW.horizon
    assert [m[4]["seed"] for m in topics[WIDTH_TOPIC]] == [7 + i for i in range(len(times))]
    metadata = topics["metadata"]["policypipe.predict"]
    assert metadata["recording"] == validation.name and metadata["seed"] == "7"
    assert str(pipeline.policy) not in json.dumps(metadata)  # no path: the bytes do not depend on where


def test_each_chunk_is_what_the_runner_acts_on_the_robots_observation_with_the_chunks_seed(
    pipeline: Pipeline, validation: Path, predicted, one_thread
) -> None:
    topics = read_back(predicted[0])
    runner = PolicyRunner.load(pipeline.policy)
    start = topics[PREDICTED_TOPIC][0][3]  # the episode starts at the first chunk's frame
    for predicted_msg, width in list(zip(topics[PREDICTED_TOPIC], topics[WIDTH_TOPIC]))[::3]:
        t, seed = predicted_msg[3], width[4]["seed"]
        chunk = runner.act(robot_observation(validation, t), seed=seed, episode_start_ns=start)
        poses = predicted_msg[4].poses
        position = np.array([[p.position.x, p.position.y, p.position.z] for p in poses])
        quaternion = np.array(
            [[p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w] for p in poses]
        )
        np.testing.assert_array_equal(position, chunk.position)
        np.testing.assert_array_equal(quaternion, chunk.quaternion)
        np.testing.assert_array_equal(width[4]["width_m"], chunk.width)
        assert width[4]["time_ns"] == chunk.time_ns.tolist()


def test_the_same_seed_gives_the_same_bytes_wherever_written_and_another_seed_others(
    pipeline: Pipeline, validation: Path, predicted, tmp_path: Path
) -> None:
    out, _ = predicted
    again = tmp_path / "elsewhere" / "again.mcap"
    predict_recording(pipeline.policy, validation, again, PredictConfig(seed=7))
    assert again.read_bytes() == out.read_bytes()
    other = tmp_path / "other.mcap"
    predict_recording(pipeline.policy, validation, other, PredictConfig(seed=8, max_chunks=3))
    first_three = [m[4].poses for m in read_back(out)[PREDICTED_TOPIC][:3]]
    assert [m[4].poses for m in read_back(other)[PREDICTED_TOPIC]] != first_three
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "again.mcap",
        "elsewhere",
        "other.mcap",
    ]  # no temp left


def test_every_and_max_chunks_set_the_schedule(pipeline: Pipeline, validation: Path, tmp_path: Path) -> None:
    summary = predict_recording(
        pipeline.policy, validation, tmp_path / "p.mcap", PredictConfig(every=1, max_chunks=5)
    )
    times, _ = expected_times(validation, every=1)
    assert summary.observation_ns == times[:5] and summary.every == 1


def test_the_robot_feed_holds_only_the_frames_the_next_chunk_can_use(
    pipeline: Pipeline, validation: Path
) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    feed = RobotFeed(read_streams(validation, ConvertConfig().topics), runner, validation)
    sizes = [len(observation().frames) for _, state, observation in feed.frames() if state == "fed"]
    # n_obs_steps = 2 at 30 Hz: the frame at t and the one or two around t - 33 ms.
    assert len(sizes) > 200 and max(sizes) <= WINDOW.n_obs_steps + 1


def test_a_video_recording_gives_the_chunks_of_its_full_resolution_frames(
    pipeline: Pipeline, tmp_path: Path, one_thread
) -> None:
    export = write_sample_export(
        tmp_path / "video", SampleConfig(recordings=1, seed=5, camera="video", defects=False)
    )
    (vio,) = sorted(export.root.rglob("*_vio.mcap"))
    summary = predict_recording(pipeline.policy, vio, tmp_path / "p.mcap", PredictConfig(max_chunks=4))
    topics = read_back(tmp_path / "p.mcap")
    assert summary.chunks == 4
    # What a robot with a video camera would send: frames decoded at the camera's full resolution.
    streams = read_streams(vio, ConvertConfig().topics)
    full = decode_frames(streams.cameras[0], (320, 240))
    order = np.argsort(full.capture_ns)
    runner = PolicyRunner.load(pipeline.policy)
    start = summary.observation_ns[0]
    pose, width = np.argsort(streams.pose_ns), np.argsort(streams.width_ns)
    for i, msg in enumerate(topics[PREDICTED_TOPIC]):
        t = msg[3]
        frames = [j for j in order if t - 100_000_000 <= full.capture_ns[j] <= t]
        p = pose[: np.searchsorted(streams.pose_ns[pose], t) + 1]  # up to the first sample at or after t
        w = width[: np.searchsorted(streams.width_ns[width], t) + 1]
        obs = Observation.checked(
            full.capture_ns[frames], full.rgb[frames], streams.pose_ns[p], streams.position[p],
            streams.quaternion[p], streams.width_ns[w], streams.width[w],
        )  # fmt: skip
        chunk = runner.act(obs, seed=i, episode_start_ns=start)  # chunk i: seed 0 + i
        position = np.array([[q.position.x, q.position.y, q.position.z] for q in msg[4].poses])
        np.testing.assert_array_equal(position, chunk.position)


def test_the_cli_writes_the_predictions_and_prints_a_summary(
    pipeline: Pipeline, validation: Path, predicted, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the default topics
    code = main(["predict", str(pipeline.policy), str(validation), "-o", "out.mcap", "--seed", "7"])
    captured = capsys.readouterr()
    assert code == 0
    assert f"{predicted[1].chunks} chunks, one every {WINDOW.n_action_steps} frames" in captured.out
    assert "open out.mcap together with" in captured.out
    assert (tmp_path / "out.mcap").read_bytes() == predicted[0].read_bytes()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("not_mcap", "{recording} is not an MCAP file"),
        ("no_runtime", "policy {policy} has no runtime.json"),
        ("no_policy", "policy folder {policy} not found"),
        ("no_recording", "recording {recording} not found"),
    ],
)
def test_bad_input_is_one_error_line_naming_the_file(
    pipeline: Pipeline, validation: Path, tmp_path: Path, capsys, damage: str, says: str
) -> None:
    policy, recording = pipeline.policy, validation
    if damage == "not_mcap":
        recording = tmp_path / "rec_vio.mcap"
        recording.write_text("a status file, not a recording\n")
    elif damage == "no_runtime":
        policy = tmp_path / "old_policy"
        shutil.copytree(pipeline.policy, policy)
        (policy / "runtime.json").unlink()
    elif damage == "no_policy":
        policy = tmp_path / "nowhere"
    else:
        recording = tmp_path / "missing_vio.mcap"
    code = main(["predict", str(policy), str(recording), "-o", str(tmp_path / "p.mcap")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert (
        captured.err.startswith("error: ") and says.format(policy=policy, recording=recording) in captured.err
    )
    assert not (tmp_path / "p.mcap").exists()


def test_the_recording_itself_is_never_the_output(pipeline: Pipeline, validation: Path) -> None:
    with pytest.raises(PredictionError, match="is the recording itself"):
        predict_recording(pipeline.policy, validation, validation)


def rewritten(vio: Path, out: Path, change) -> None:
    """A copy of `vio` with each message's bytes as `change(topic, decoded message)` gives them:
    the message's new bytes, its own (`message.SerializeToString()`), or None to leave it out."""
    factory = DecoderFactory()
    with open(vio, "rb") as f, open(out, "wb") as g:
        writer = Writer(g)
        writer.start()
        schemas, channels = {}, {}
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=False):
            if schema.id not in schemas:
                schemas[schema.id] = writer.register_schema(schema.name, schema.encoding, schema.data)
            if channel.id not in channels:
                channels[channel.id] = writer.register_channel(
                    channel.topic, channel.message_encoding, schemas[schema.id]
                )
            data = message.data
            if channel.message_encoding == "protobuf":
                data = change(channel.topic, factory.decoder_for("protobuf", schema)(data))
            if data is not None:
                writer.add_message(channels[channel.id], message.log_time, data, message.publish_time)
        writer.finish()


def with_a_bad_pose_sample(vio: Path, out: Path, k: int) -> int:
    """A copy of `vio` whose k-th pose message has a quaternion of norm 1.1; its capture time."""
    poses, stamp = 0, None

    def change(topic: str, msg) -> bytes:
        nonlocal poses, stamp
        if topic == "/vio/pose":
            if poses == k:
                o = msg.pose.orientation
                o.x, o.y, o.z, o.w = (1.1 * v for v in (o.x, o.y, o.z, o.w))
                stamp = msg.timestamp.ToNanoseconds()
            poses += 1
        return msg.SerializeToString()

    rewritten(vio, out, change)
    return stamp


def test_a_bad_pose_sample_is_refused_where_a_chunk_needs_it_and_predicting_goes_on(
    pipeline: Pipeline, validation: Path, predicted, tmp_path: Path
) -> None:
    good = predicted[1].observation_ns
    # The last pose sample at or before the middle chunk's frame: in that chunk's window.
    pose_ns = read_streams(validation, ConvertConfig().topics).pose_ns  # file order
    k = int(np.argmax(np.where(pose_ns <= good[len(good) // 2], pose_ns, -1)))
    bad = with_a_bad_pose_sample(validation, tmp_path / "bad_vio.mcap", k)
    summary = predict_recording(
        pipeline.policy, tmp_path / "bad_vio.mcap", tmp_path / "p.mcap", PredictConfig(seed=7)
    )
    assert summary.skipped[REFUSED] >= 1 and "not 1" in summary.first_refusal
    assert any("refused by the runner" in line for line in summary.lines())
    # Before the bad sample, the same chunks; at the frame that needs it none, and the robot asks
    # again at the next frames until their windows have left it behind.
    assert [t for t in summary.observation_ns if t < bad] == [t for t in good if t < bad]
    assert good[len(good) // 2] not in summary.observation_ns
    assert summary.observation_ns[-1] > bad and summary.chunks >= len(good) - 1


def with_large_frames(vio: Path, out: Path, frames: int, size: tuple[int, int]) -> int:
    """A copy of `vio` with its first `frames` camera frames replaced by PNGs of noise of `size`
    (width, height) and the later ones left out; the bytes of those frames."""
    rng, total, seen = np.random.default_rng(0), 0, 0

    def change(topic: str, msg) -> bytes | None:
        nonlocal total, seen
        if topic == "/camera0/image":
            if seen == frames:
                return None
            noise = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            msg.data, msg.format = cv2.imencode(".png", noise)[1].tobytes(), "png"
            total += len(msg.data)
            seen += 1
        return msg.SerializeToString()

    rewritten(vio, out, change)
    return total


def test_predicting_holds_a_few_frames_never_the_recordings(
    pipeline: Pipeline, validation: Path, tmp_path: Path
) -> None:
    def peak_and_frame_bytes(frames: int) -> tuple[int, int]:
        vio = tmp_path / f"{frames}_vio.mcap"
        compressed = with_large_frames(validation, vio, frames, size=(240, 180))  # 130 KB a frame
        tracemalloc.start()
        try:
            summary = predict_recording(
                pipeline.policy, vio, tmp_path / "p.mcap", PredictConfig(max_chunks=8)
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert summary.chunks == 8
        return peak, compressed

    short, long = peak_and_frame_bytes(40), peak_and_frame_bytes(160)
    # A few decoded frames and the file's chunk being read (about 1 MB, a few copies of it) are
    # held, whatever the recording's length: 120 more frames (16 MB) add nothing like their bytes.
    added = long[1] - short[1]
    assert long[0] - short[0] < added / 10, (
        f"peak {short[0] / 1e6:.1f} MB with {short[1] / 1e6:.1f} MB of frames, "
        f"{long[0] / 1e6:.1f} MB with {long[1] / 1e6:.1f} MB"
    )


def test_a_monitored_policy_writes_its_reading_of_every_chunk_to_plot_beside_the_frames(
    pipeline: Pipeline, validation: Path, monitored: Path, predicted, tmp_path: Path
) -> None:
    out = tmp_path / "monitored.mcap"
    summary = predict_recording(monitored, validation, out, PredictConfig(seed=7))
    topics = read_back(out)
    readings = topics[MONITOR_TOPIC]
    assert {m[:3] for m in readings} == {("policypipe.MonitorReading", "jsonschema", "json")}
    assert [m[3] for m in readings] == [m[4]["timestamp_ns"] for m in readings] == summary.observation_ns
    assert readings[0][4]["inconsistency"] is None and all(m[4]["inconsistency"] > 0 for m in readings[1:])
    assert all(m[4]["novelty"] > 0 and isinstance(m[4]["alarm"], bool) for m in readings)
    assert summary.alarms_s == [(m[3] - readings[0][3]) / 1e9 for m in readings if m[4]["alarm"]]
    # The same chunks as without the monitor, and no monitor topic from a policy without one.
    plain = read_back(predicted[0])
    assert [m[4] for m in topics[WIDTH_TOPIC]] == [m[4] for m in plain[WIDTH_TOPIC]]
    assert MONITOR_TOPIC not in plain
