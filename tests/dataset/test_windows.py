"""Action and observation windows on the time axis, against the sample recordings' continuous truth."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import EpisodeStreams, WindowConfig, Windows, relative_poses, rot6d
from policypipe.synthetic.recording import StreamTiming
from policypipe.synthetic.render import read_timecode, timecode_value
from tests.dataset.conftest import make_store
from tests.dataset.test_convert import add_recording, convert, episodes

WINDOW = WindowConfig(n_obs_steps=3, horizon=8, n_action_steps=4)


@pytest.fixture(scope="module")
def gappy_recording(tmp_path_factory):
    """One converted recording whose camera dropped a quarter of its frames: (store, plan, truth)."""
    tmp = tmp_path_factory.mktemp("gappy")
    (tmp / "export").mkdir()
    plan, truth = add_recording(tmp / "export", "gappy", 8, timing=StreamTiming(camera_drop_fraction=0.25))
    convert(tmp / "export", tmp / "ds.zarr")
    return tmp / "ds.zarr", plan, truth


def relative_truth(plan, anchor_ns: int, t_ns: np.ndarray) -> np.ndarray:
    """(K, 9): the plan's poses at `t_ns` relative to its pose at `anchor_ns`."""
    (pa,), (qa,) = plan.pose_at(np.array([anchor_ns]))
    p, q = plan.pose_at(t_ns)
    to_anchor = Rotation.from_quat(qa).inv()
    return np.concatenate(
        [to_anchor.apply(p - pa), rot6d((to_anchor * Rotation.from_quat(q)).as_matrix())], axis=1
    )


def test_window_targets_on_a_recording_with_dropped_frames_are_at_the_exact_times(gappy_recording) -> None:
    store, plan, truth = gappy_recording
    root, [(start, end)] = episodes(store)
    (record,) = root.attrs[layout.ATTRS_EPISODES]
    f = root.attrs[layout.ATTRS_FREQUENCY]
    frame_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start:end] * 1e9).astype(np.int64)
    period_ns = 1e9 / f
    assert (np.diff(frame_ns) > 1.5 * period_ns).mean() > 0.15  # many steps would cross a gap by index

    ds = WindowDataset(store, [0], WINDOW)
    rel = lambda ns: (ns - truth.width_ns[0]).astype(float)  # noqa: E731
    width_at = lambda ns: np.interp(rel(ns), rel(truth.width_ns), plan.width_at(truth.width_ns))  # noqa: E731
    for i in range(0, len(ds), 3):
        sample, anchor_ns = ds[i], frame_ns[ds.anchors[i]]
        clamp = lambda ns: np.clip(ns, frame_ns[0], frame_ns[-1])  # noqa: E731 - edge padding
        future = clamp(anchor_ns + np.round((np.arange(WINDOW.horizon) + 1) * period_ns).astype(np.int64))
        past = clamp(
            anchor_ns - np.round(np.arange(WINDOW.n_obs_steps - 1, -1, -1) * period_ns).astype(np.int64)
        )
        action, obs_pose = sample["action"].double().numpy(), sample["obs_pose"].double().numpy()
        for got, times in ((action[:, :9], future), (obs_pose, past)):
            want = relative_truth(plan, anchor_ns, times)
            assert np.abs(got[:, :3] - want[:, :3]).max() < 3e-4  # metres: 150 Hz samples, linear between
            assert np.abs(got[:, 3:] - want[:, 3:]).max() < 5e-4  # 6D rotation: < 0.03 degrees
        # Width exactly as the recorded ~45 Hz samples give it at those times: observed as it is,
        # and in actions as the change from the width at the anchor.
        assert np.abs(sample["obs_width"][:, 0].double().numpy() - width_at(past)).max() < 1e-6
        assert np.abs(action[:, 9] - (width_at(future) - width_at(np.array([anchor_ns])))).max() < 1e-6
        # Each observation's image is the frame nearest its time.
        nearest = frame_ns[np.abs(frame_ns[:, None] - past[None]).argmin(axis=0)]
        assert [read_timecode(img) for img in sample["obs_images"].numpy()] == [
            timecode_value(t) for t in nearest
        ]


def test_no_anchor_has_more_than_n_action_steps_minus_one_padded_steps(
    gappy_recording, tmp_path: Path
) -> None:
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40), drop_fraction=0.25)
    for store, chosen in ((gappy_recording[0], [0]), (tmp_path / "ds.zarr", [0, 1, 2])):
        root = zarr.open_group(store, mode="r")
        stamps, f = root[layout.TIMESTAMP][:], root.attrs[layout.ATTRS_FREQUENCY]
        ends = root[layout.EPISODE_ENDS][:]
        expected = []
        for e in chosen:
            first, last = (ends[e - 1] if e else 0), ends[e] - 1
            for a in range(first, last + 1):
                padded = np.sum(stamps[a] + (np.arange(WINDOW.horizon) + 1) / f > stamps[last] + 1e-9)
                if padded <= WINDOW.n_action_steps - 1:
                    expected.append(a)
        ds = WindowDataset(store, chosen, WINDOW)
        assert ds.anchors.tolist() == expected  # exactly the frames the rule allows, none dropped needlessly
        assert len(expected) < ends[chosen[-1]] - (ends[chosen[0] - 1] if chosen[0] else 0)


def test_padding_repeats_the_last_frame_and_never_reaches_the_next_episode(tmp_path: Path) -> None:
    root = make_store(tmp_path / "ds.zarr", lengths=(20, 20), drop_fraction=0.25)
    streams = EpisodeStreams.from_store(root)
    anchors, owner = streams.anchors([0], WINDOW)
    w = streams.windows(anchors[-1:], WINDOW)  # the last anchor: the most padded window
    stamps, f = root[layout.TIMESTAMP][:], root.attrs[layout.ATTRS_FREQUENCY]
    padded = stamps[anchors[-1]] + (np.arange(WINDOW.horizon) + 1) / f > stamps[19] + 1e-9
    assert 1 <= padded.sum() <= WINDOW.n_action_steps - 1
    np.testing.assert_allclose(
        w.action[0, padded], np.broadcast_to(w.action[0, padded][0], w.action[0, padded].shape)
    )
    # The padded steps hold the pose and width at episode 0's last frame (the width as the change
    # from the anchor's).
    one_step = WindowConfig(n_obs_steps=1, horizon=1, n_action_steps=1)
    last, anchor = streams.windows(np.array([19]), one_step), streams.windows(anchors[-1:], one_step)
    np.testing.assert_allclose(
        w.action[0, padded][0, 9], last.obs_width[0, 0, 0] - anchor.obs_width[0, 0, 0], atol=1e-12
    )
    assert set(owner.tolist()) == {0}


def test_step_zero_is_one_period_ahead_not_the_identity(tmp_path: Path) -> None:
    make_store(tmp_path / "ds.zarr", lengths=(30,))
    sample = WindowDataset(tmp_path / "ds.zarr", [0], WINDOW)[10]
    identity = np.array([0, 0, 0, 1, 0, 0, 0, 1, 0], dtype=np.float32)
    assert np.allclose(
        sample["obs_pose"][-1].numpy(), identity, atol=1e-6
    )  # the last observation is the anchor
    assert np.abs(sample["action"][0, :3].numpy()).max() > 1e-3  # the first action has moved on


def test_a_dataset_of_the_previous_format_is_refused_saying_how_to_rebuild_it(tmp_path: Path) -> None:
    root = make_store(tmp_path / "old.zarr", lengths=(20, 20))
    root.attrs[layout.ATTRS_FORMAT] = 1  # frame-indexed windows, no recorded streams
    with pytest.raises(ValueError, match=r"old\.zarr has format version 1.*dvc repro convert"):
        EpisodeStreams.from_store(zarr.open_group(tmp_path / "old.zarr", mode="r"))


def test_windows_are_the_same_bits_in_chunks_in_one_pass_and_anchor_by_anchor(tmp_path: Path) -> None:
    """`windows` vectorises over chunks of anchors; no number of a window may depend on which
    anchors share its chunk: the statistics, the training samples and eval group them differently."""
    root = make_store(tmp_path / "ds.zarr", drop_fraction=0.25)
    streams = EpisodeStreams.from_store(root)
    anchors, _ = streams.anchors(list(range(root[layout.EPISODE_ENDS].shape[0])), WINDOW)
    whole = streams.windows(anchors, WINDOW, chunk=len(anchors))
    chunked = streams.windows(anchors, WINDOW, chunk=11)  # chunks that split episodes, a short last one
    alone = [streams.windows(anchors[i : i + 1], WINDOW) for i in range(len(anchors))]
    assert len(anchors) % 11 and whole.action.shape == (len(anchors), WINDOW.horizon, 10)
    for field in fields(Windows):
        np.testing.assert_array_equal(getattr(chunked, field.name), getattr(whole, field.name))
        np.testing.assert_array_equal(
            np.concatenate([getattr(w, field.name) for w in alone]), getattr(whole, field.name)
        )


def test_relative_rotations_are_the_per_sample_products_bit_for_bit() -> None:
    """relative_poses multiplies each anchor's inverse rotation with its window's rotations side by
    side, in one product: every entry must still be the number R_anchor^T R_k gives alone, so that
    statistics computed before do not move in the last bit."""
    rng = np.random.default_rng(0)
    m, k = 40, 9
    rot = Rotation.from_rotvec(rng.normal(0, 1.5, (m * k, 3))).as_matrix().reshape(m, k, 3, 3)
    pos = rng.normal(0, 0.3, (m, k, 3))
    got = relative_poses(pos[:, 4], rot[:, 4], pos, rot)
    assert got.shape == (m, k, 9)
    for i in range(m):
        for j in range(k):
            np.testing.assert_array_equal(got[i, j, 3:], rot6d(rot[i, 4].T @ rot[i, j]))
            np.testing.assert_allclose(
                got[i, j, :3], rot[i, 4].T @ (pos[i, j] - pos[i, 4]), rtol=0, atol=1e-15
            )
