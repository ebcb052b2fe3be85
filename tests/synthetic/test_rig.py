"""The rig sample (recording format 2): two grippers side by side, a scene camera, their topics,
clocks and determinism; what each camera sees."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from mcap.reader import make_reader

from policypipe.synthetic.export import RIG_RECORDING_WITHOUT_SCENE_CAMERA, SampleConfig, write_sample_export
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.render import camera_matrix, project, render_fixed_view_bgr, table_texture
from policypipe.synthetic.rig import WORKSPACE_SPACING_M, plan_rig

START_NS = 1_793_000_000_000_000_000
RIG = SampleConfig(
    recordings=3, defects=False, image_width=96, image_height=72, grippers=2, scene_camera=True
)


@pytest.fixture(scope="module")
def rig_export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rig") / "export"
    write_sample_export(out, RIG, workers=1)
    return out


def messages(path: Path) -> dict[str, list]:
    with open(path, "rb") as f:
        found: dict[str, list] = {}
        for schema, channel, message in make_reader(f).iter_messages():
            found.setdefault(channel.topic, []).append((schema.name, message))
        return found


def test_gripper0_plans_the_single_gripper_sample_and_the_other_works_beside_it() -> None:
    rng = np.random.default_rng(7)
    alone = [plan_motion(rng, START_NS), plan_motion(rng, START_NS)]  # the same draws, in order
    rig = plan_rig(np.random.default_rng(7), START_NS, grippers=2)
    np.testing.assert_array_equal(rig.plans[0].knot_position, alone[0].knot_position)
    np.testing.assert_array_equal(rig.plans[0].scene.target_xy, alone[0].scene.target_xy)
    beside = np.array([0.0, WORKSPACE_SPACING_M])
    np.testing.assert_allclose(rig.plans[1].scene.target_xy, alone[1].scene.target_xy + beside, atol=1e-12)
    np.testing.assert_allclose(rig.plans[1].scene.place_xy, alone[1].scene.place_xy + beside, atol=1e-12)
    np.testing.assert_allclose(
        rig.plans[1].knot_position[:, :2], alone[1].knot_position[:, :2] + beside, atol=1e-12
    )
    # One table: the same texture, centred between the workspaces.
    assert rig.plans[0].scene.texture_seed == rig.plans[1].scene.texture_seed
    np.testing.assert_array_equal(rig.plans[0].scene.table_center, rig.plans[1].scene.table_center)


def test_a_rig_recording_has_the_version2_topics_on_their_own_clocks(rig_export: Path) -> None:
    found = messages(rig_export / "session_01" / "rec_0001_vio.mcap")
    assert sorted(found) == [
        "/camera0/image",
        "/camera1/image",
        "/camera2/image",
        "/robot0/gripper/width",
        "/robot0/vio/pose",
        "/robot1/gripper/width",
        "/robot1/vio/pose",
    ]
    assert {s for s, _ in found["/robot1/vio/pose"]} == {"foxglove.PoseInFrame"}
    assert {s for s, _ in found["/camera2/image"]} == {"foxglove.CompressedImage"}

    def capture_ns(topic: str) -> np.ndarray:
        stamps = [CompressedImage.FromString(m.data).timestamp for _, m in found[topic]]
        return np.sort([t.seconds * 1_000_000_000 + t.nanos for t in stamps])

    wrist, scene = capture_ns("/camera0/image"), capture_ns("/camera2/image")
    assert abs(1e9 / np.median(np.diff(wrist)) - 30.0) < 0.5
    assert abs(1e9 / np.median(np.diff(scene)) - 20.0) < 0.5
    assert wrist[0] != scene[0]  # each starts on its own
    assert {CompressedImage.FromString(m.data).frame_id for _, m in found["/camera1/image"]} == {"camera1"}


def test_the_second_recording_lacks_its_scene_camera(rig_export: Path) -> None:
    stem = f"rec_{RIG_RECORDING_WITHOUT_SCENE_CAMERA + 1:04d}"
    found = messages(rig_export / "session_01" / f"{stem}_vio.mcap")
    assert "/camera2/image" not in found and "/camera1/image" in found


def test_the_scene_camera_sees_both_blocks_and_each_gripper_where_it_is(rig_export: Path) -> None:
    found = messages(rig_export / "session_01" / "rec_0001_vio.mcap")
    first = CompressedImage.FromString(found["/camera2/image"][0][1].data)
    bgr = cv2.imdecode(np.frombuffer(first.data, np.uint8), cv2.IMREAD_COLOR)
    red = (bgr[..., 2] > 150) & (bgr[..., 1] < 80) & (bgr[..., 0] < 80)
    count, _ = cv2.connectedComponents(red.astype(np.uint8))
    assert count - 1 == 2  # two blocks (the background is label 0)

    rig = plan_rig(np.random.default_rng(3), START_NS, grippers=2)
    r_cam, centre = rig.scene_camera()
    texture = table_texture(rig.table, tuple((p.scene.place_xy, p.scene.place_yaw) for p in rig.plans))
    t = np.array([START_NS + 1_000_000_000])
    blocks = [(b[0][0], float(b[1][0]), b[2]) for b in rig.blocks_at(t)]
    grippers = [(*(a[0] for a in p.pose_at(t)), float(p.width_at(t)[0])) for p in rig.plans]
    size = (320, 240)
    without = render_fixed_view_bgr(rig.table, texture, r_cam, centre, blocks, [], size)
    for i, gripper in enumerate(grippers):
        alone = render_fixed_view_bgr(rig.table, texture, r_cam, centre, blocks, [gripper], size)
        changed = np.argwhere(np.abs(alone.astype(int) - without).sum(axis=2) > 30)
        assert len(changed) > 50, i
        (uv,), _ = project(gripper[0][None], r_cam, centre, camera_matrix(*size))
        # The drawn gripper surrounds its TCP's pixel (within the body's few centimetres).
        assert np.linalg.norm(changed[:, ::-1].mean(axis=0) - uv) < 25, i


def test_a_rig_export_is_byte_identical_for_the_same_config(rig_export: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    write_sample_export(again, RIG, workers=2)

    def digests(root: Path) -> dict[str, str]:
        return {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    assert digests(again) == digests(rig_export)


@pytest.mark.parametrize(
    "change, mentions",
    [({"grippers": 0}, "grippers=0"), ({"grippers": 2, "camera": "video"}, "leave camera at 'image'")],
)
def test_a_rig_config_that_cannot_work_is_refused(change: dict, mentions: str) -> None:
    with pytest.raises(ValueError, match=mentions):
        SampleConfig(**change)
