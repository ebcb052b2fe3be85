"""robomimic / MimicGen HDF5 files as a source: the pair stage's inventory and the converted
dataset's values, against the arrays written with h5py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import resize_frame
from policypipe.lineage.hashing import sha256_file
from policypipe.recordings.hdf5 import Hdf5Rejected, RobomimicConfig, finger_opening, robomimic_inventory
from policypipe.recordings.pairing import PairConfig, pair_export
from tests.recordings.robomimic_files import CAMERAS, write_robomimic

TWO_CAMERAS = RobomimicConfig(cameras=CAMERAS)


def test_demos_come_in_numeric_order_and_a_filter_keeps_only_its_demos(tmp_path: Path) -> None:
    path = tmp_path / "lift.hdf5"
    write_robomimic(path, {10: 20, 2: 20, 0: 20, 1: 20}, masks={"valid": [10, 1]})

    demos, rejected = robomimic_inventory(path, RobomimicConfig())
    assert [d.key for d in demos] == ["data/demo_0", "data/demo_1", "data/demo_2", "data/demo_10"]
    assert rejected == []
    assert {d.source.control_hz for d in demos} == {20.0}  # env_args' env_kwargs.control_freq

    filtered, _ = robomimic_inventory(path, RobomimicConfig(filter_key="valid"))
    assert [d.key for d in filtered] == ["data/demo_1", "data/demo_10"]

    with pytest.raises(Hdf5Rejected) as refused:
        robomimic_inventory(path, RobomimicConfig(filter_key="train"))
    assert refused.value.reason == "no_filter"
    assert "no mask/train in the file (it has valid)" in refused.value.detail


def test_the_control_rate_is_the_files_else_the_param_else_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "no_rate.hdf5"
    write_robomimic(path, {0: 20}, control_freq=None)
    with pytest.raises(Hdf5Rejected) as refused:
        robomimic_inventory(path, RobomimicConfig())
    assert refused.value.reason == "no_control_rate"
    assert "set pair.robomimic.control_hz" in refused.value.detail

    demos, _ = robomimic_inventory(path, RobomimicConfig(control_hz=15.0))
    assert demos[0].source.control_hz == 15.0
    # The file's own rate wins over the param, which is only for files that lack one.
    write_robomimic(path, {0: 20}, control_freq=10)
    demos, _ = robomimic_inventory(path, RobomimicConfig(control_hz=15.0))
    assert demos[0].source.control_hz == 10.0


def test_the_inventory_reports_every_file_and_demo_it_cannot_read_and_keeps_the_rest(tmp_path: Path) -> None:
    export = tmp_path / "export"
    (export / "sim").mkdir(parents=True)
    write_robomimic(export / "sim" / "lift.hdf5", {0: 20, 3: 20, 7: 20}, without={3: ("robot0_eef_quat",)})
    (export / "broken.hdf5").write_bytes(b"not hdf5 at all")
    (export / "notes.txt").write_text("demos from the lab")

    result = pair_export(export, PairConfig(source="robomimic"))

    assert [r.stem for r in result.recordings] == ["lift.demo_0", "lift.demo_7"]
    reasons = {r.path: r.reason.value for r in result.rejections}
    assert reasons == {
        "broken.hdf5": "not_hdf5",
        "notes.txt": "not_an_input",
        "sim/lift.hdf5#data/demo_3": "missing_keys",
    }
    metrics = result.metrics()
    assert (metrics["demos_rejected"], metrics["files_rejected"], metrics["files_seen"]) == (1, 2, 3)
    detail = next(r.detail for r in result.rejections if r.path.endswith("demo_3"))
    assert "no obs/robot0_eef_quat" in detail and "pair.robomimic" in detail

    manifest = result.manifest()
    entry = manifest["recordings"][1]
    assert manifest["source"] == "robomimic"
    assert entry["folder"] == "sim"
    assert entry["files"]["hdf5"]["sha256"] == sha256_file(export / "sim" / "lift.hdf5")
    assert entry["source"]["key"] == "data/demo_7"
    assert entry["status"] == {"frames": 20}


def test_the_studio_export_is_paired_as_before_when_the_source_is_mcap(tmp_path: Path) -> None:
    """An HDF5 file in a studio export is no input, and the manifest keeps its keys."""
    (tmp_path / "lift.hdf5").write_bytes(b"x")
    result = pair_export(tmp_path, PairConfig())
    assert result.rejections[0].reason.value == "not_an_input"
    assert set(result.manifest()) == {"format_version", "task", "accept_truncated", "recordings"}


def _convert(export: Path, tmp_path: Path, pair: PairConfig, **convert) -> tuple[zarr.Group, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(pair_export(export, pair).manifest()))
    config = ConvertConfig(image_size=(24, 24), min_frames=8, **convert)
    result = convert_dataset(manifest, export, tmp_path / "dataset.zarr", tmp_path / "cache", config)
    return zarr.open_group(tmp_path / "dataset.zarr", mode="r"), result.excluded


def test_a_converted_demo_holds_the_files_values_on_its_control_clock(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    written = write_robomimic(export / "lift.hdf5", {0: 30, 2: 25, 11: 40})

    root, excluded = _convert(export, tmp_path, PairConfig(source="robomimic"))

    assert excluded == []
    assert root.attrs[layout.ATTRS_FREQUENCY] == 20.0
    episodes = root.attrs[layout.ATTRS_EPISODES]
    assert [ep["stem"] for ep in episodes] == ["lift.demo_0", "lift.demo_2", "lift.demo_11"]
    ends = np.asarray(root[layout.EPISODE_ENDS][:])
    assert ends.tolist() == [30, 55, 95]
    starts = np.concatenate([[0], ends[:-1]])
    for e, key in enumerate(["data/demo_0", "data/demo_2", "data/demo_11"]):
        obs, rows = written[key], slice(int(starts[e]), int(ends[e]))
        n = rows.stop - rows.start
        assert episodes[e]["source"] == {"format": "robomimic", "path": "lift.hdf5", "key": key}
        np.testing.assert_allclose(root[layout.TIMESTAMP][rows], np.arange(n) / 20.0, rtol=0, atol=1e-12)
        # Stored as float32: exact to its rounding.
        np.testing.assert_allclose(root[layout.EEF_POS][rows], obs["robot0_eef_pos"], rtol=0, atol=1e-7)
        angle = (
            Rotation.from_rotvec(root[layout.EEF_ROT][rows]).inv()
            * Rotation.from_quat(obs["robot0_eef_quat"])
        ).magnitude()
        assert angle.max() < 1e-6
        qpos = obs["robot0_gripper_qpos"]
        np.testing.assert_allclose(root[layout.GRIPPER_WIDTH][rows][:, 0], qpos[:, 0] - qpos[:, 1], atol=1e-7)
        # The recorded samples are the rows themselves, on the same clock.
        np.testing.assert_allclose(
            root[layout.POSE_POS][int(starts[e]) : int(ends[e])], obs["robot0_eef_pos"], rtol=0, atol=0
        )
        frames = root[layout.RGB][rows]
        expected = np.stack([resize_frame(f, (24, 24)) for f in obs[CAMERAS[0]]])
        # The dataset stores JPEG (convert.jpeg_quality 95): within a few levels of the resized rows.
        assert np.abs(frames.astype(int) - expected.astype(int)).mean() < 2.0


def test_a_demo_without_a_kept_camera_is_masked_or_excluded_as_convert_says(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    write_robomimic(export / "lift.hdf5", {0: 20, 1: 20}, without={1: (CAMERAS[1],)})
    pair = PairConfig(source="robomimic", robomimic=TWO_CAMERAS)

    root, excluded = _convert(export, tmp_path / "masked", pair, cameras=(0, 1), on_missing_camera="mask")
    assert excluded == []
    valid = np.asarray(root[layout.camera_valid(1)][:])
    assert valid[:20].all() and not valid[20:].any()
    frames = root[layout.camera_rgb(1)][:20]
    assert frames.std() > 10  # demo 0's wrist frames, not black

    _, excluded = _convert(export, tmp_path / "excluded", pair, cameras=(0, 1))
    assert [(e["stem"], e["excluded"]) for e in excluded] == [("lift.demo_1", "missing_camera")]
    assert "obs/robot0_eye_in_hand_image of data/demo_1" in excluded[0]["detail"]


def test_the_opening_is_the_left_finger_joint_less_the_right() -> None:
    """Panda's finger joints are each finger's distance from the centre (left +, right -)."""
    assert finger_opening(np.array([[0.04, -0.04], [0.011, -0.012]])).tolist() == pytest.approx([0.08, 0.023])
