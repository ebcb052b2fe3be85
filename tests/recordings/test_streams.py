"""Reading the streams of a _vio.mcap: topic mapping from params, other pose schemas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from mcap.reader import make_reader
from mcap.writer import Writer
from mcap_protobuf.schema import build_file_descriptor_set

from policypipe.recordings.streams import RecordingError, Topics, read_streams
from policypipe.recordings.sample import StreamTiming, plan_motion, write_vio_mcap

START_NS = 1_762_160_000_000_000_000


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "r_vio.mcap"
    rng = np.random.default_rng(3)
    write_vio_mcap(path, plan_motion(rng, START_NS, duration_s=2.0), StreamTiming(), rng, image_size=(64, 48))
    return path


def rewrite_pose_as_transforms(src: Path, dst: Path) -> int:
    """The same recording with /vio/pose replaced by /tf FrameTransforms, plus a distractor frame."""
    schema = FrameTransform.DESCRIPTOR
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        writer = Writer(fout)
        writer.start()
        tf_schema = writer.register_schema(schema.full_name, "protobuf", build_file_descriptor_set(FrameTransform).SerializeToString())
        tf = writer.register_channel("/tf", "protobuf", tf_schema)
        channels: dict[int, int] = {}
        poses = 0
        for sch, channel, message in make_reader(fin).iter_messages(log_time_order=False):
            if channel.topic == "/vio/pose":
                pose = PoseInFrame.FromString(message.data)
                for child, offset in (("gripper", 0.0), ("camera", 0.5)):
                    t = FrameTransform(parent_frame_id="world", child_frame_id=child)
                    t.timestamp.CopyFrom(pose.timestamp)
                    t.translation.x = pose.pose.position.x + offset
                    t.translation.y, t.translation.z = pose.pose.position.y, pose.pose.position.z
                    t.rotation.CopyFrom(pose.pose.orientation)
                    writer.add_message(tf, log_time=message.log_time, publish_time=message.log_time, data=t.SerializeToString())
                poses += 1
                continue
            if channel.id not in channels:
                sid = writer.register_schema(sch.name, sch.encoding, sch.data)
                channels[channel.id] = writer.register_channel(channel.topic, channel.message_encoding, sid)
            writer.add_message(channels[channel.id], log_time=message.log_time, publish_time=message.log_time, data=message.data)
        writer.finish()
    return poses


def test_frame_transform_pose_of_the_configured_child_frame(recording: Path, tmp_path: Path) -> None:
    reference = read_streams(recording, Topics())
    poses = rewrite_pose_as_transforms(recording, tmp_path / "tf_vio.mcap")

    streams = read_streams(tmp_path / "tf_vio.mcap", Topics(pose="/tf", pose_child_frame="gripper"))

    assert len(streams.pose_ns) == poses == len(reference.pose_ns)
    assert np.array_equal(streams.pose_ns, reference.pose_ns)
    assert np.allclose(streams.position, reference.position) and np.allclose(streams.quaternion, reference.quaternion)


def test_missing_topic_names_the_topics_that_are_there(recording: Path) -> None:
    with pytest.raises(RecordingError) as info:
        read_streams(recording, Topics(pose="/slam/pose"))
    assert info.value.reason == "missing_topic"
    assert "no messages on /slam/pose" in str(info.value)
    assert "/vio/pose (foxglove.PoseInFrame)" in str(info.value) and "/gripper/width (GripperWidth)" in str(info.value)


def test_capture_times_come_from_the_messages_not_log_time(recording: Path) -> None:
    streams = read_streams(recording, Topics())
    with open(recording, "rb") as f:
        log_times = [m.log_time for _, c, m in make_reader(f).iter_messages(log_time_order=False) if c.topic == "/camera0/image"]
    assert len(log_times) == len(streams.camera_ns)
    assert not np.array_equal(np.asarray(log_times), streams.camera_ns)
    assert streams.camera_format == "jpeg" and streams.truncated is None
