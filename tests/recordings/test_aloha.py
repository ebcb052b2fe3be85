"""ALOHA / RDT HDF5 files as a source: the inventory, the control rate as a required param, and the
joint-space dataset's values against the arrays written with h5py (raw, padded-JPEG and
variable-length JPEG frames)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from policypipe.config import ConfigError, from_mapping
from policypipe.dataset import layout
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import resize_frame
from policypipe.lineage.hashing import sha256_file
from policypipe.recordings.aloha import ALOHA_JOINTS, AlohaConfig
from policypipe.recordings.pairing import PairConfig, pair_export
from tests.recordings.aloha_files import CAMERAS, write_aloha

ALOHA = PairConfig(source="aloha", aloha=AlohaConfig(control_hz=50.0))


def test_the_control_rate_is_required_before_any_file_is_read() -> None:
    with pytest.raises(ConfigError) as refused:
        from_mapping(PairConfig, {"source": "aloha"}, "pair")
    assert "aloha.control_hz is required" in str(refused.value)
    assert (
        from_mapping(PairConfig, {"source": "aloha", "aloha": {"control_hz": 50}}, "pair").aloha.control_hz
        == 50
    )
    with pytest.raises((ConfigError, ValueError), match="pair.aloha.joint_names must be distinct"):
        from_mapping(
            PairConfig, {"source": "aloha", "aloha": {"control_hz": 50, "joint_names": ["a", "a"]}}, "pair"
        )


def test_the_inventory_takes_each_file_as_an_episode_and_reports_what_it_cannot_read(tmp_path: Path) -> None:
    write_aloha(tmp_path / "episode_0.hdf5", 30)
    write_aloha(tmp_path / "episode_1.hdf5", 30, seed=1, without=("cam_high",))
    write_aloha(tmp_path / "episode_2.hdf5", 30, seed=2, joints=12)
    (tmp_path / "episode_3.hdf5").write_text("not hdf5")

    result = pair_export(tmp_path, ALOHA)

    assert [r.stem for r in result.recordings] == ["episode_0"]
    entry = result.manifest()["recordings"][0]
    assert entry["files"]["hdf5"]["sha256"] == sha256_file(tmp_path / "episode_0.hdf5")
    assert entry["source"]["control_hz"] == 50.0 and entry["source"]["joint_names"] == list(ALOHA_JOINTS)
    assert entry["status"] == {"frames": 30}
    reasons = {r.path: (r.reason.value, r.detail) for r in result.rejections}
    assert reasons["episode_1.hdf5"][0] == "missing_keys"
    assert (
        "no observations/images/cam_high (its cameras: cam_left_wrist, cam_right_wrist)"
        in reasons["episode_1.hdf5"][1]
    )
    assert reasons["episode_2.hdf5"][0] == "missing_keys"
    assert "pair.aloha.joint_names has 14 names: both must be (N, 14)" in reasons["episode_2.hdf5"][1]
    assert reasons["episode_3.hdf5"][0] == "not_hdf5"


def _convert(export: Path, tmp_path: Path, pair: PairConfig, **convert) -> tuple[zarr.Group, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "manifest.json").write_text(json.dumps(pair_export(export, pair).manifest()))
    config = ConvertConfig(image_size=(20, 16), min_frames=8, **convert)
    result = convert_dataset(
        tmp_path / "manifest.json", export, tmp_path / "d.zarr", tmp_path / "cache", config
    )
    return zarr.open_group(tmp_path / "d.zarr", mode="r"), result.excluded


@pytest.mark.parametrize("images", ["raw", "padded", "vlen"])
def test_an_episode_holds_the_files_joints_commands_and_frames_on_its_control_clock(
    tmp_path: Path, images: str
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    written = [write_aloha(export / f"episode_{i}.hdf5", 25 + 5 * i, seed=i, images=images) for i in range(2)]

    root, excluded = _convert(export, tmp_path / "out", ALOHA, cameras=(0, 1, 2))

    assert excluded == []
    assert root.attrs[layout.ATTRS_REPRESENTATION] == "joint"
    assert root.attrs[layout.ATTRS_JOINT_NAMES] == list(ALOHA_JOINTS)
    assert root.attrs[layout.ATTRS_GRIPPER_JOINTS] == ["left_gripper", "right_gripper"]
    assert root.attrs[layout.ATTRS_FREQUENCY] == 50.0  # the param: the files do not hold it
    assert np.asarray(root[layout.EPISODE_ENDS][:]).tolist() == [25, 55]
    for e, (rows, arrays) in enumerate(zip([slice(0, 25), slice(25, 55)], written)):
        n = rows.stop - rows.start
        np.testing.assert_allclose(root[layout.TIMESTAMP][rows], np.arange(n) / 50.0, rtol=0, atol=1e-12)
        # float32 in the store: equal to the file's float64 to its rounding.
        np.testing.assert_allclose(root[layout.JOINT_STATE][rows], arrays["qpos"], rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(root[layout.JOINT_ACTION][rows], arrays["action"], rtol=1e-7, atol=1e-7)
        for k, camera in enumerate(CAMERAS):
            stored = np.asarray(root[layout.camera_rgb(k)][rows]).astype(int)
            expected = np.stack([resize_frame(f, (20, 16)) for f in arrays[camera]]).astype(int)
            # Raw rows: only resized, then JPEG in the store. JPEG rows: decoded, in RGB (red is the
            # strong channel: a swapped order would put it in blue).
            assert np.abs(stored - expected).mean() < (3.0 if images == "raw" else 5.0), (camera, images)
            assert stored[..., 0].mean() > 150 and stored[..., 2].mean() < 60
        assert root.attrs[layout.ATTRS_EPISODES][e]["source"] == {
            "format": "aloha",
            "path": f"episode_{e}.hdf5",
        }


def test_a_missing_wrist_camera_is_masked_or_excludes_the_episode(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    write_aloha(export / "episode_0.hdf5", 20)
    write_aloha(export / "episode_1.hdf5", 20, seed=1, without=("cam_left_wrist",))

    root, excluded = _convert(export, tmp_path / "masked", ALOHA, cameras=(0, 1), on_missing_camera="mask")
    assert excluded == []
    valid = np.asarray(root[layout.camera_valid(1)][:])
    assert valid[:20].all() and not valid[20:].any()

    _, excluded = _convert(export, tmp_path / "excluded", ALOHA, cameras=(0, 1))
    assert [(e["stem"], e["excluded"]) for e in excluded] == [("episode_1", "missing_camera")]
    assert "observations/images/cam_left_wrist" in excluded[0]["detail"]


def test_an_episode_with_a_row_that_is_not_finite_is_excluded_and_the_others_kept(tmp_path: Path) -> None:
    import h5py

    export = tmp_path / "export"
    export.mkdir()
    write_aloha(export / "episode_0.hdf5", 20)
    write_aloha(export / "episode_1.hdf5", 20, seed=1)
    with h5py.File(export / "episode_1.hdf5", "r+") as f:
        f["action"][7, 3] = np.nan

    root, excluded = _convert(export, tmp_path / "out", ALOHA)

    assert [(e["stem"], e["excluded"]) for e in excluded] == [("episode_1", "bad_message")]
    assert "(the first: row 7)" in excluded[0]["detail"]
    assert [ep["stem"] for ep in root.attrs[layout.ATTRS_EPISODES]] == ["episode_0"]
