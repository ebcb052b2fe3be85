from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation
from torch.utils.data import DataLoader

from policypipe.dataset import layout
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig, relative_poses
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=2, horizon=6, n_action_steps=3)


def test_samples_cover_only_the_chosen_episodes_with_edge_padding(tmp_path: Path) -> None:
    root = make_store(tmp_path / "ds.zarr", lengths=(10, 12, 9))
    ds = WindowDataset(tmp_path / "ds.zarr", [0, 2], WINDOW)
    # An anchor needs horizon - n_action_steps + 1 = 4 of its steps inside the episode: frames
    # 0..5 of episode 0 (frames 0..9), 0..4 of episode 2 (frames 22..30).
    assert ds.anchors.tolist() == [*range(0, 6), *range(22, 27)]

    first = ds[0]  # episode 0's first frame: the past is padded with itself
    assert first["obs_images"].shape == (2, 12, 16, 3) and first["obs_images"].dtype == torch.uint8
    assert torch.equal(first["obs_images"][0], first["obs_images"][1])
    assert torch.allclose(first["obs_pose"][0], first["obs_pose"][1])
    assert (
        first["action"].shape == (6, 10)
        and first["obs_pose"].shape == (2, 9)
        and first["obs_width"].shape == (2, 1)
    )

    last_of_ep0 = ds[5]  # steps 0..3 reach frames 6..9; 4 and 5 are padded with frame 9, never episode 1
    assert torch.allclose(last_of_ep0["action"][3:], last_of_ep0["action"][3].expand(3, 10))
    assert not torch.allclose(last_of_ep0["action"][2], last_of_ep0["action"][3])
    width = root[layout.GRIPPER_WIDTH][:, 0]
    # The width as the change from the anchor's (frame 5).
    assert torch.allclose(last_of_ep0["action"][3:, 9], torch.tensor(width[9] - width[5]).float(), atol=1e-4)
    assert np.array_equal(
        ds[6]["obs_images"][1].numpy(), root[layout.RGB][22]
    )  # episode 2 starts at frame 22


def test_loads_in_worker_processes(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr")
    ds = WindowDataset(tmp_path / "ds.zarr", [0, 1, 2], WINDOW)
    ds[0]  # the parent has opened its reader: workers must still get their own
    batches = list(DataLoader(ds, batch_size=16, num_workers=2, shuffle=False))
    assert sum(len(b["action"]) for b in batches) == len(ds)
    assert torch.equal(batches[0]["obs_images"][3], ds[3]["obs_images"])


def test_a_batch_read_at_once_is_each_sample_read_alone(tmp_path: Path) -> None:
    # The DataLoader asks for a batch at a time (__getitems__): one vectorised window computation,
    # one frame read, and the same numbers as sample by sample.
    make_store(tmp_path / "ds.zarr", drop_fraction=0.2)
    ds = WindowDataset(tmp_path / "ds.zarr", [0, 2, 3, 5], WINDOW)
    picked = np.random.default_rng(0).integers(len(ds), size=24).tolist()
    together = ds.__getitems__(picked)
    assert len(together) == len(picked)
    for i, item in zip(picked, together):
        alone = ds[i]
        assert item.keys() == alone.keys() and all(torch.equal(item[k], alone[k]) for k in item)


def test_samples_for_a_policy_that_remembers_its_start_carry_the_episodes_first_frame_and_pose(
    tmp_path: Path,
) -> None:
    root = make_store(tmp_path / "ds.zarr", lengths=(10, 12, 9))
    ds = WindowDataset(tmp_path / "ds.zarr", [1, 2], WINDOW, episode_start=True)
    rows = root[layout.RGB]
    pos, rot = root[layout.EEF_POS][:].astype(np.float64), root[layout.EEF_ROT][:].astype(np.float64)
    identity = np.array([0.0] * 3 + [1, 0, 0, 0, 1, 0])
    for i in range(len(ds)):
        item, anchor = ds[i], int(ds.anchors[i])
        first = 10 if anchor < 22 else 22  # episode 1 starts at frame 10, episode 2 at 22
        assert np.array_equal(item["start_image"].numpy(), rows[first])
        assert item["start_pose"].shape == (1, 9)
        # The first frame's pose in the anchor's frame, as the stored frame poses give it.
        r = Rotation.from_rotvec(rot[[anchor, first]]).as_matrix()
        expected = relative_poses(pos[anchor][None], r[:1], pos[first][None, None], r[None, 1:])[0, 0]
        np.testing.assert_allclose(item["start_pose"][0].numpy(), expected, atol=1e-5)
        if anchor == first:
            np.testing.assert_allclose(expected, identity, atol=1e-12)
    assert {int(a) for a in ds.anchors} >= {10, 22} and len(ds) > 2
    # Without images there is no first frame to add.
    with pytest.raises(ValueError, match="episode_start adds the episode's first frame"):
        WindowDataset(tmp_path / "ds.zarr", [1], WINDOW, images=False, episode_start=True)
