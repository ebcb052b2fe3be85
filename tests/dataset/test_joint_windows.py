"""Joint-space windows (`dataset.JointSeries`) and their statistics, against the rows of
the HDF5 files they were converted from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from policypipe.dataset import layout
from policypipe.dataset.joint_windows import JointSeries
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from tests.recordings.aloha_files import convert_aloha

WINDOW = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)


@pytest.fixture(scope="module")
def aloha_dataset(tmp_path_factory) -> tuple[zarr.Group, list[dict[str, np.ndarray]]]:
    store, written = convert_aloha(tmp_path_factory.mktemp("aloha"))
    return zarr.open_group(store, mode="r"), written


def test_windows_are_the_files_rows_exactly_with_the_command_at_the_anchor_first(aloha_dataset) -> None:
    root, written = aloha_dataset
    series = JointSeries.from_store(root)
    anchors, owners = series.anchors([0, 3], WINDOW)
    # An anchor's step horizon - n_action_steps = 4 must be inside its episode: rows 0..len-5.
    assert np.bincount(owners).tolist()[0] == 30 - 4 and np.bincount(owners)[3] == 36 - 4
    w = series.windows(anchors, WINDOW)
    starts = np.concatenate([[0], np.asarray(root[layout.EPISODE_ENDS][:])])
    for m, (anchor, e) in enumerate(zip(anchors, owners)):
        row = anchor - starts[e]
        qpos = written[e]["qpos"].astype(np.float32)
        action = written[e]["action"].astype(np.float32)
        rows = np.minimum(np.arange(row, row + WINDOW.horizon), len(qpos) - 1)  # padded past the end
        np.testing.assert_array_equal(w.action[m].astype(np.float32), action[rows])
        np.testing.assert_array_equal(w.obs_state[m, 1].astype(np.float32), qpos[row])
        np.testing.assert_array_equal(w.obs_state[m, 0].astype(np.float32), qpos[max(row - 1, 0)])
        assert w.obs_frames[m].tolist() == [starts[e] + max(row - 1, 0), anchor]


def test_a_time_between_rows_interpolates_its_neighbours() -> None:
    # Row 2 of 4 was dropped (its frame did not decode): 0, 20, 60 ms.
    state = np.array([[0.0, 1.0], [1.0, 1.0], [3.0, 0.0]])
    series = JointSeries(50.0, np.array([0.0, 0.02, 0.06]), np.array([3]), state, state + 10, ("a", "b"))
    w = series.windows(np.array([1]), WindowConfig(n_obs_steps=1, horizon=2, n_action_steps=1))
    np.testing.assert_allclose(w.action[0], [[11.0, 11.0], [12.0, 10.5]])  # 20 ms, then 40 ms between rows


def test_statistics_of_a_joint_space_dataset_name_its_joints_and_cover_the_training_windows(
    aloha_dataset,
) -> None:
    root, _ = aloha_dataset
    stats = compute_statistics(root, WINDOW, StatsConfig(val_fraction=0.2, test_fraction=0.2))
    assert stats["joints"]["names"] == list(root.attrs[layout.ATTRS_JOINT_NAMES])
    assert stats["joints"]["grippers"] == ["left_gripper", "right_gripper"]
    assert set(stats["lowdim"]) == {"action", "action_per_step", "obs.joint_state"}
    series = JointSeries.from_store(root)
    anchors, _ = series.anchors(stats["split"]["train"], WINDOW)
    w = series.windows(anchors, WINDOW)
    state = stats["lowdim"]["obs.joint_state"]
    np.testing.assert_allclose(state["mean"], w.obs_state.reshape(-1, 14).mean(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(stats["lowdim"]["action"]["max"], w.action.reshape(-1, 14).max(axis=0))
    per_step = stats["lowdim"]["action_per_step"]
    assert len(per_step["min"]) == WINDOW.horizon * 14 and state["count"] == len(anchors) * 2
    assert len(stats["image"]) == 2  # both cameras


def test_the_dataset_plots_of_a_joint_space_dataset_show_its_joints(aloha_dataset, tmp_path: Path) -> None:
    from policypipe.dataset.report import write_plots

    root, _ = aloha_dataset
    written = write_plots(root, tmp_path, {"train": [0, 1, 2, 3], "val": [4], "test": [5]})
    assert sorted(p.name for p in written) == [
        "contact_sheet.png",
        "episode_lengths.png",
        "joint_positions.png",
    ]
