"""A rig dataset (recording format 2: two grippers, a scene camera): conversion against the rig's
ground truth, and the windows and statistics over it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import nearest_sample
from policypipe.dataset.errors import DatasetError
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import (
    EpisodeStreams,
    WindowConfig,
    observation_names,
)
from policypipe.evaluation.samples import collect_samples, mean_motion
from policypipe.recordings.streams import read_streams
from policypipe.synthetic.recording import StreamTiming, write_simulated_raw, write_simulated_vio
from policypipe.synthetic.render import read_timecode, timecode_value
from policypipe.synthetic.rig import SCENE_CAMERA_HZ, RigRecording, plan_rig, simulate_rig_recording
from tests.conftest import write_status
from tests.dataset.test_convert import START_NS, add_recording, convert

SCENE = 2  # the scene camera of a two-gripper rig
CONFIG = ConvertConfig(
    image_size=(64, 48),
    min_frames=10,
    workers=1,
    grippers=(0, 1),
    cameras=(0, 1, SCENE),
    on_missing_camera="mask",
)
WRIST_TIMING = (
    StreamTiming(camera_start_s=0.05, pose_start_s=0.1, width_start_s=0.02, width_stop_s=0.2, pose_hz=150.0),
    StreamTiming(
        camera_start_s=0.12, camera_drop_fraction=0.0, pose_hz=200.0, width_hz=40.0, pose_stop_s=0.15
    ),
)
# Its own rate, its own start, and drops.
SCENE_TIMING = StreamTiming(
    camera_hz=SCENE_CAMERA_HZ, camera_jitter_s=0.002, camera_drop_fraction=0.04, camera_start_s=0.2
)


def add_rig_recording(
    export: Path, stem: str, seed: int, absent: frozenset[int] = frozenset()
) -> RigRecording:
    rng = np.random.default_rng(seed)
    rig = plan_rig(rng, START_NS + seed * 60_000_000_000, grippers=2, duration_s=3.0)
    rec = simulate_rig_recording(
        rig, WRIST_TIMING, SCENE_TIMING, rng, image_size=(96, 72), timecode=True, absent_cameras=absent
    )
    write_simulated_vio(export / f"{stem}_vio.mcap", rec)
    write_simulated_raw(export / f"{stem}.mcap", rec)
    write_status(export / f"{stem}_vio.json", stem, frames=rec.truth.frames)
    return rec


@pytest.fixture(scope="module")
def rig_export(tmp_path_factory) -> tuple[Path, dict[str, RigRecording]]:
    export = tmp_path_factory.mktemp("rig") / "export"
    export.mkdir()
    recordings = {
        "a": add_rig_recording(export, "a", 1),
        "b": add_rig_recording(export, "b", 2, absent=frozenset({SCENE})),  # the scene camera unplugged
        "c": add_rig_recording(export, "c", 3),
    }
    return export, recordings


@pytest.fixture(scope="module")
def rig_dataset(rig_export, tmp_path_factory):
    export, recordings = rig_export
    out = tmp_path_factory.mktemp("rig_ds") / "ds.zarr"
    result = convert(export, out, CONFIG)
    return zarr.open_group(out, mode="r"), result, recordings


def rows_of(root, result, stem):
    ends = root[layout.EPISODE_ENDS][:]
    e = [ep["stem"] for ep in result.episodes].index(stem)
    start = 0 if e == 0 else int(ends[e - 1])
    record = result.episodes[e]
    t_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start : ends[e]] * 1e9).astype(np.int64)
    return slice(start, int(ends[e])), t_ns, record


def test_every_gripper_pose_and_width_match_the_plan_at_each_camera0_frame(rig_dataset) -> None:
    root, result, recordings = rig_dataset
    assert root.attrs[layout.ATTRS_GRIPPERS] == [0, 1] and root.attrs[layout.ATTRS_CAMERAS] == [0, 1, 2]
    for stem, rec in recordings.items():
        rows, t_ns, _ = rows_of(root, result, stem)
        for i, plan in enumerate(rec.rig.plans):
            pos, quat = plan.pose_at(t_ns)
            assert np.abs(root[layout.eef_pos(i)][rows] - pos).max() < 1e-4, (stem, i)
            rot = Rotation.from_rotvec(root[layout.eef_rot(i)][rows])
            assert np.degrees((rot.inv() * Rotation.from_quat(quat)).magnitude()).max() < 0.05
            # Exact against the recorded samples (linear between them): float32 storage.
            width_ns = rec.truth.width_ns[i]
            recorded = np.interp(
                (t_ns - START_NS).astype(float), (width_ns - START_NS).astype(float), plan.width_at(width_ns)
            )
            assert np.abs(root[layout.gripper_width(i)][rows, 0] - recorded).max() < 1e-7
        # The two grippers really are two: their workspaces lie apart.
        assert np.abs(root[layout.eef_pos(1)][rows][:, 1] - root[layout.eef_pos(0)][rows][:, 1]).min() > 0.1


def test_the_rows_span_what_every_gripper_covers_and_its_samples_are_kept(rig_dataset) -> None:
    root, result, recordings = rig_dataset
    for stem, rec in recordings.items():
        rows, t_ns, record = rows_of(root, result, stem)
        lo, hi = rows_span(rec)
        inside = rec.truth.camera_ns[0][(rec.truth.camera_ns[0] >= lo) & (rec.truth.camera_ns[0] <= hi)]
        np.testing.assert_array_equal(t_ns, inside)
        assert record["robot1_pose_samples"] > 0 and record["robot1_width_samples"] > 0


def test_camera0_and_every_other_camera_show_the_frame_of_their_recorded_time(rig_dataset) -> None:
    root, result, recordings = rig_dataset
    for stem, rec in recordings.items():
        rows, t_ns, _ = rows_of(root, result, stem)
        frames = root[layout.camera_rgb(0)][rows]
        assert [read_timecode(f) for f in frames] == [timecode_value(t) for t in t_ns]
        for k in (1, SCENE):
            offset = root[layout.camera_offset(k)][rows]
            valid = root[layout.camera_valid(k)][rows]
            if k not in rec.truth.camera_ns:
                assert not valid.any() and not root[layout.camera_rgb(k)][rows].any()
                continue
            own = rec.truth.camera_ns[k]
            expected = own[nearest_sample(own, t_ns)] - t_ns
            assert np.array_equal(valid, np.abs(expected) <= CONFIG.max_camera_offset_ms * 1e6)
            np.testing.assert_allclose(offset[valid], expected[valid] / 1e9, atol=1e-9)
            assert (offset[~valid] == 0).all()
            images = root[layout.camera_rgb(k)][rows]
            shown = [read_timecode(f) for f in images[valid]]
            assert shown == [timecode_value(t) for t in (t_ns + expected)[valid]], (stem, k)
            assert not images[~valid].any()  # a masked row is black, and says so
        # The scene camera runs slower than camera 0 and drops frames: its rows repeat frames.
        if SCENE in rec.truth.camera_ns:
            assert len(np.unique(root[layout.camera_offset(SCENE)][rows] + (t_ns - t_ns[0]) / 1e9)) < len(
                t_ns
            )


def test_the_report_gives_each_camera_its_own_rate_gaps_and_offsets(rig_dataset) -> None:
    root, result, recordings = rig_dataset
    gaps = 0
    for stem, rec in recordings.items():
        record = next(ep for ep in result.episodes if ep["stem"] == stem)
        cameras = record["cameras"]
        assert set(cameras) == {"camera1", "camera2"}
        rows, t_ns, _ = rows_of(root, result, stem)
        if SCENE not in rec.truth.camera_ns:
            assert cameras["camera2"]["topic"] is None
            assert cameras["camera2"]["rows_missing"] == len(t_ns)
            assert any("camera2 has no readable frame" in w for w in record["warnings"])
            continue
        scene = cameras["camera2"]
        assert scene["topic"] == "/camera2/image"
        assert abs(scene["frequency_hz"] - SCENE_CAMERA_HZ) < 0.2
        # Its dropped frames within the rows' span, counted on its nominal clock.
        own = rec.truth.camera_ns[SCENE]
        inside = own[(own >= rows_span(rec)[0]) & (own <= rows_span(rec)[1])]
        expected = int((np.rint(np.diff(inside) * SCENE_CAMERA_HZ / 1e9) - 1).sum())
        assert scene["gaps"] == expected
        gaps += expected
        assert scene["offset_ms"]["max_abs"] <= CONFIG.max_camera_offset_ms
        assert abs(cameras["camera1"]["frequency_hz"] - 30.0) < 0.3 and cameras["camera1"]["gaps"] == 0
    assert gaps > 0  # the scene camera dropped frames, and the report counted them
    scene = result.metrics()["cameras"]["camera2"]
    assert scene["episodes_absent"] == 1 and scene["gaps"] == gaps
    assert 0 < scene["offset_ms_max"] <= CONFIG.max_camera_offset_ms


def rows_span(rec: RigRecording) -> tuple[int, int]:
    """The span every gripper's pose and width cover: what a recording contributes."""
    lo = max(max(rec.truth.pose_ns[i][0], rec.truth.width_ns[i][0]) for i in (0, 1))
    hi = min(min(rec.truth.pose_ns[i][-1], rec.truth.width_ns[i][-1]) for i in (0, 1))
    return lo, hi


def test_a_missing_camera_excludes_its_recording_unless_masked(rig_export, tmp_path: Path) -> None:
    export, _ = rig_export
    result = convert(export, tmp_path / "ds.zarr", replace(CONFIG, on_missing_camera="exclude"))
    assert [ep["stem"] for ep in result.episodes] == ["a", "c"]
    (excluded,) = result.excluded
    assert excluded["stem"] == "b" and excluded["excluded"] == "missing_camera"
    assert (
        "camera2 has no readable frame" in excluded["detail"]
        and "on_missing_camera: mask" in excluded["detail"]
    )


def test_a_dataset_may_keep_fewer_grippers_and_cameras_than_recorded(rig_export, tmp_path: Path) -> None:
    export, recordings = rig_export
    result = convert(export, tmp_path / "ds.zarr", replace(CONFIG, grippers=(0,), cameras=(0,)))
    root = zarr.open_group(tmp_path / "ds.zarr", mode="r")
    assert sorted(k for k in root["data"].keys()) == sorted(
        k.split("/")[1] for k in (layout.RGB, *layout.LOWDIM_KEYS, layout.TIMESTAMP)
    )
    rows, t_ns, _ = rows_of(root, result, "a")
    pos, _ = recordings["a"].rig.plans[0].pose_at(t_ns)
    assert np.abs(root[layout.EEF_POS][rows] - pos).max() < 1e-4
    # One gripper and camera 0 read the way a version 1 dataset is: training reads it.
    EpisodeStreams.from_store(root)


def test_evaluations_samples_and_mean_motion_hold_every_gripper(rig_dataset) -> None:
    root, _, _ = rig_dataset
    store = Path(root.store.root)
    window = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)
    samples = collect_samples(store, [0, 1], window, stride=4)
    assert samples.batch["action"].shape[1:] == (8, 20) and "obs_valid_camera2" in samples.batch
    data = WindowDataset(store, [0, 1], window)
    actions = np.stack([data[i]["action"].numpy() for i in range(len(data))]).astype(np.float64)
    streams = EpisodeStreams.from_store(root)
    np.testing.assert_allclose(mean_motion(streams, [0, 1], window), actions.mean(axis=0), atol=1e-6)


def test_a_batch_of_rig_samples_read_at_once_with_decoded_frames_is_each_read_alone(rig_dataset) -> None:
    root, _, _ = rig_dataset
    store = Path(root.store.root)
    window = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)
    plain = WindowDataset(store, [0, 1], window)
    cached = WindowDataset(store, [0, 1], window)
    # Room for camera 0's frames and half camera 1's: the rest, the scene camera's, decoded on demand.
    rows = len(np.unique(plain.streams.observation_frames(plain.anchors, window)[0]))
    cached.keep_decoded_frames((rows + rows // 2) * 64 * 48 * 3, shared=False)
    assert [cached._decoded[k].rows_kept for k in (0, 1, SCENE)] == [rows, rows // 2, 0]
    picked = list(range(0, len(plain), 3))
    together = cached.__getitems__(picked)
    assert {"obs_images_camera1", "obs_images_camera2", "obs_valid_camera2"} <= set(together[0])
    for i, item in zip(picked, together):
        alone = plain[i]
        assert item.keys() == alone.keys() and all(torch.equal(item[k], alone[k]) for k in item)


def test_version1_and_version2_names_of_gripper0_are_one_stream(rig_export, tmp_path: Path) -> None:
    export, _ = rig_export
    streams = read_streams(export / "a_vio.mcap", CONFIG.topics, (0, 1), (0, 1, SCENE))
    assert streams.grippers[0].pose_topic == "/robot0/vio/pose"
    assert streams.grippers[1].width_topic == "/robot1/gripper/width"
    assert streams.cameras[SCENE].topic == "/camera2/image"
    assert not streams.warnings
    # A gripper the file does not have: named, with the topics it has.
    from policypipe.recordings.messages import RecordingError

    with pytest.raises(
        RecordingError,
        match=r"no messages on /robot2/vio/pose \(convert.grippers \[0, 2\] asks for gripper 2\); "
        "topics present: /camera0/image",
    ):
        read_streams(export / "a_vio.mcap", CONFIG.topics, (0, 2), (0,))


def test_a_recording_of_one_gripper_under_two_grippers_is_excluded_naming_the_param(tmp_path: Path) -> None:
    # Excluded as "no messages on /robot1/vio/pose" before: true, and silent on why it was looked for.
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "one", 1)  # format 1: /vio/pose, /gripper/width
    add_rig_recording(export, "two", 4)
    result = convert(export, tmp_path / "ds.zarr", replace(CONFIG, cameras=(0,)))
    assert [ep["stem"] for ep in result.episodes] == ["two"]
    (excluded,) = result.excluded
    assert excluded["stem"] == "one" and excluded["excluded"] == "missing_topic"
    assert "convert.grippers [0, 1] asks for gripper 1" in excluded["detail"], excluded["detail"]
    assert "recording of one gripper (format 1): convert it with convert.grippers: [0]" in excluded["detail"]


# ---------------------------------------------------------------- windows and statistics over a rig


def test_windows_give_each_gripper_its_own_frame_and_the_other_in_it(
    rig_dataset, rig_export, tmp_path
) -> None:
    root, result, recordings = rig_dataset
    window = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)
    streams = EpisodeStreams.from_store(root)
    assert streams.grippers == 2
    anchors, owners = streams.anchors([0, 1, 2], window)
    w = streams.windows(anchors, window)
    assert w.obs_pose.shape == (len(anchors), 2, 36) and w.obs_width.shape == (len(anchors), 2, 2)
    assert w.action.shape == (len(anchors), 8, 20)
    assert observation_names(2) == ["robot0", "robot1", "robot1_wrt0", "robot0_wrt1"]

    # Against the plans: at each anchor, gripper 1 seen from gripper 0, and gripper 1's own motion.
    episode_starts = {i: ep["start_ns"] for i, ep in enumerate(result.episodes)}
    stems = [ep["stem"] for ep in result.episodes]
    t_rel = root[layout.TIMESTAMP][:][anchors]
    for m in range(0, len(anchors), 17):
        plans = recordings[stems[owners[m]]].rig.plans
        t = episode_starts[owners[m]] + int(round(t_rel[m] * 1e9))
        (p0,), (q0,) = plans[0].pose_at(np.array([t]))
        (p1,), (q1,) = plans[1].pose_at(np.array([t]))
        r0 = Rotation.from_quat(q0)
        np.testing.assert_allclose(w.obs_pose[m, -1, 18:21], r0.inv().apply(p1 - p0), atol=2e-4)
        future = t + int(round(1e9 / streams.frequency_hz))  # action step 0, one period ahead
        (p1f,), _ = plans[1].pose_at(np.array([future]))
        np.testing.assert_allclose(
            w.action[m, 0, 10:13], Rotation.from_quat(q1).inv().apply(p1f - p1), atol=2e-4
        )
        width_now = plans[1].width_at(np.array([t]))[0]
        np.testing.assert_allclose(w.obs_width[m, -1, 1], width_now, atol=5e-4)
    # Each gripper's own block is at the identity at the anchor (its own frame).
    identity = np.array([0, 0, 0, 1, 0, 0, 0, 1, 0])
    np.testing.assert_allclose(w.obs_pose[:, -1, 0:9], np.tile(identity, (len(anchors), 1)), atol=1e-9)
    np.testing.assert_allclose(w.obs_pose[:, -1, 9:18], np.tile(identity, (len(anchors), 1)), atol=1e-9)

    # Gripper 0's blocks are the windows of the same recordings converted with gripper 0 alone.
    export, _ = rig_export
    convert(export, tmp_path / "one.zarr", replace(CONFIG, grippers=(0,), cameras=(0,)))
    alone = EpisodeStreams.from_store(zarr.open_group(tmp_path / "one.zarr", mode="r"))
    w0 = alone.windows(alone.anchors([0, 1, 2], window)[0], window)
    np.testing.assert_allclose(w.obs_pose[..., :9], w0.obs_pose, atol=1e-9)
    np.testing.assert_allclose(w.action[..., :10], w0.action, atol=1e-9)


def test_statistics_cover_every_gripper_and_camera(rig_dataset) -> None:
    root, _, _ = rig_dataset
    window = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)
    stats = compute_statistics(
        root, window, StatsConfig(val_fraction=0.3, test_fraction=0.0, image_sample_frames=50)
    )
    assert stats["grippers"]["obs.eef_pose_rel"] == observation_names(2)
    assert len(stats["lowdim"]["obs.eef_pose_rel"]["mean"]) == 36
    assert (
        len(stats["lowdim"]["action"]["mean"]) == 20
        and len(stats["lowdim"]["obs.gripper_width"]["mean"]) == 2
    )
    assert set(stats["image"]) == {layout.camera_rgb(k) for k in (0, 1, SCENE)}
    # The scene camera's rows without a frame (a whole recording of them) are left out of its statistics.
    valid = root[layout.camera_valid(SCENE)][:]
    train_rows = sum(
        int(e - s)
        for i, (s, e) in enumerate(zip([0, *root[layout.EPISODE_ENDS][:-1]], root[layout.EPISODE_ENDS][:]))
        if i in stats["split"]["train"]
    )
    assert stats["image"][layout.camera_rgb(SCENE)]["count"] <= min(50, int(valid.sum()))
    assert stats["image"][layout.camera_rgb(0)]["count"] == min(50, train_rows)


def test_a_camera_whose_every_message_is_unreadable_is_missing_not_a_lost_recording(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    rec = add_rig_recording(export, "a", 4)
    broken = tuple(
        replace(m, data=b"\xff\xff not a CompressedImage") if m.channel == "/camera1/image" else m
        for m in rec.vio_messages
    )
    write_simulated_vio(export / "a_vio.mcap", replace(rec, vio_messages=broken))
    result = convert(export, tmp_path / "ds.zarr", CONFIG)  # on_missing_camera: mask
    (episode,) = result.episodes
    assert episode["cameras"]["camera1"]["rows_missing"] == episode["frames"]
    assert episode["lost_messages"]["camera1"] == len(rec.truth.camera_ns[1])
    with pytest.raises(
        DatasetError, match="camera1 has no readable frame.*the file is damaged: camera1: skipped"
    ):
        convert(export, tmp_path / "ds2.zarr", replace(CONFIG, on_missing_camera="exclude"))


@pytest.mark.parametrize("numbers", [(0, 2), (1,), (0, 0, 1)])
def test_camera_and_gripper_numbers_must_run_from_0_in_order(numbers) -> None:
    for name in ("cameras", "grippers"):
        with pytest.raises(ValueError, match=rf"{name}=\[.*\]: keep {name} 0 to n in order"):
            ConvertConfig(**{name: numbers})
