"""Statistics against a plain per-sample NumPy reference on the in-memory arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation, Slerp

from policypipe.atomic import canonical_json
from policypipe.dataset import layout
from policypipe.dataset.split import episode_groups, group_fraction, split_episodes
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=3, horizon=6, n_action_steps=3)
CONFIG = StatsConfig(seed=3, val_fraction=0.3, block_frames=17, quantile_bins=4096)  # blocks split episodes


@pytest.fixture
def gappy_store(tmp_path: Path) -> Path:
    """Like `store`, with a quarter of the camera's frames missing."""
    make_store(tmp_path / "gappy.zarr", drop_fraction=0.25)
    return tmp_path / "gappy.zarr"


def reference_samples(root: zarr.Group, episodes: list[int]) -> dict[str, np.ndarray]:
    """Per-sample loop, written independently of the library: each episode's recorded streams
    interpolated at anchor time + k / f, times clamped to the episode's frames, anchors with more
    than n_action_steps - 1 steps past the last frame left out."""
    f = root.attrs[layout.ATTRS_FREQUENCY]
    stamps = root[layout.TIMESTAMP][:]
    pose_t, width_t = root[layout.POSE_TIMESTAMP][:], root[layout.WIDTH_TIMESTAMP][:]
    pose_pos, pose_rot, width = root[layout.POSE_POS][:], root[layout.POSE_ROT][:], root[layout.WIDTH][:, 0]
    bounds = [
        np.concatenate([[0], root[key][:]])
        for key in (layout.EPISODE_ENDS, layout.POSE_EPISODE_ENDS, layout.WIDTH_EPISODE_ENDS)
    ]
    out = {"action": [], "action_per_step": [], "obs.eef_pose_rel": [], "obs.gripper_width": []}
    for e in episodes:
        (f0, f1), (p0, p1), (w0, w1) = ((b[e], b[e + 1]) for b in bounds)
        frames = stamps[f0:f1]
        slerp = Slerp(pose_t[p0:p1], Rotation.from_rotvec(pose_rot[p0:p1]))

        def pose(t, p0=p0, p1=p1, slerp=slerp):
            p = np.array([np.interp(t, pose_t[p0:p1], pose_pos[p0:p1, k]) for k in range(3)])
            return p, slerp([t]).as_matrix()[0]

        def rel(anchor, t):
            (pa, ra), (p, r) = pose(anchor), pose(t)
            m = ra.T @ r
            return np.concatenate([ra.T @ (p - pa), m[:, 0], m[:, 1]])

        def at(t, frames=frames):
            return min(max(t, frames[0]), frames[-1])

        for t in frames:
            future = [t + (k + 1) / f for k in range(WINDOW.horizon)]
            if sum(s > frames[-1] + 1e-9 for s in future) > WINDOW.n_action_steps - 1:
                continue
            current_width = np.interp(t, width_t[w0:w1], width[w0:w1])
            chunk = [
                np.concatenate(
                    [rel(t, at(s)), [np.interp(at(s), width_t[w0:w1], width[w0:w1]) - current_width]]
                )
                for s in future
            ]
            out["action"] += chunk
            out["action_per_step"].append(np.concatenate(chunk))  # step-major: horizon x 10
            for k in range(WINDOW.n_obs_steps - 1, -1, -1):
                s = at(t - k / f)
                out["obs.eef_pose_rel"].append(rel(t, s))
                out["obs.gripper_width"].append([np.interp(s, width_t[w0:w1], width[w0:w1])])
    return {k: np.asarray(v) for k, v in out.items()}


def test_lowdim_statistics_equal_a_numpy_reference_over_training_episodes(gappy_store: Path) -> None:
    root = zarr.open_group(gappy_store, mode="r")
    stats = compute_statistics(root, WINDOW, CONFIG)
    train = stats["split"]["train"]
    reference = reference_samples(root, train)

    for name, samples in reference.items():
        got = stats["lowdim"][name]
        assert got["count"] == len(samples)
        np.testing.assert_allclose(got["mean"], samples.mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(got["std"], samples.std(axis=0), atol=1e-12)
        np.testing.assert_allclose(got["min"], samples.min(axis=0), atol=1e-12)
        np.testing.assert_allclose(got["max"], samples.max(axis=0), atol=1e-12)
        # Quantiles, the documented tolerance: within one histogram bin of the two order
        # statistics that bracket the exact quantile (on dense data: one bin of it).
        bin_width = (samples.max(axis=0) - samples.min(axis=0)) / CONFIG.quantile_bins + 1e-12
        ordered = np.sort(samples, axis=0)
        for q, key in ((0.01, "q01"), (0.99, "q99")):
            rank = q * (len(samples) - 1)
            lo, hi = ordered[int(np.floor(rank))], ordered[int(np.ceil(rank))]
            estimate = np.asarray(got[key])
            assert np.all((estimate >= lo - bin_width) & (estimate <= hi + bin_width)), key


def test_observation_image_offsets_are_reported_per_step(gappy_store: Path) -> None:
    root = zarr.open_group(gappy_store, mode="r")
    stats = compute_statistics(root, WINDOW, CONFIG)
    stamps, f = root[layout.TIMESTAMP][:], root.attrs[layout.ATTRS_FREQUENCY]
    ends = root[layout.EPISODE_ENDS][:]
    offsets, anchors = [], 0
    for e in stats["split"]["train"]:
        frames = stamps[(ends[e - 1] if e else 0) : ends[e]]
        for t in frames[frames + (WINDOW.horizon - WINDOW.n_action_steps + 1) / f <= frames[-1] + 1e-9]:
            anchors += 1
            wanted = np.clip(t - np.arange(WINDOW.n_obs_steps - 1, -1, -1) / f, frames[0], frames[-1])
            offsets.append(np.abs(frames[:, None] - wanted[None]).min(axis=0))
    offsets_ms = 1000 * np.asarray(offsets)
    report = stats["observation_image_offset_ms"]
    assert report["anchors"] == anchors
    np.testing.assert_allclose(report["mean"], offsets_ms.mean(axis=0), atol=1e-3)
    np.testing.assert_allclose(report["max"], offsets_ms.max(axis=0), atol=1e-3)
    # The anchor's own image is its own frame; older ones fall into the gaps dropped frames leave.
    assert report["max"][-1] == 0 and report["max"][0] > 10


def test_only_training_episodes_count(store: Path) -> None:
    root = zarr.open_group(store, mode="r+")
    before = compute_statistics(root, WINDOW, CONFIG)
    for e in before["split"]["val"]:
        # Garbage wherever only validation reads: its frames, pose and width samples.
        for key, ends_key in (
            (layout.RGB, layout.EPISODE_ENDS),
            (layout.EEF_POS, layout.EPISODE_ENDS),
            (layout.POSE_POS, layout.POSE_EPISODE_ENDS),
            (layout.WIDTH, layout.WIDTH_EPISODE_ENDS),
        ):
            ends = root[ends_key][:]
            root[key][(ends[e - 1] if e else 0) : ends[e]] = 255 if key == layout.RGB else 5.0
    after = compute_statistics(root, WINDOW, CONFIG)
    # Each episode's grasps and releases are a fact of that episode, listed for all of them (eval
    # reads the held-out ones' labels); the statistics of their labels are the training side's.
    for stats in (before, after):
        stats["events"]["episodes"] = [
            r for e, r in enumerate(stats["events"]["episodes"]) if e in before["split"]["train"]
        ]
    assert canonical_json(after) == canonical_json(before)


def test_image_statistics_equal_numpy_on_the_sampled_frames(store: Path) -> None:
    root = zarr.open_group(store, mode="r")
    stats = compute_statistics(root, WINDOW, StatsConfig(seed=3, val_fraction=0.3, image_sample_frames=7))
    image = stats["image"][layout.RGB]
    ends = root[layout.EPISODE_ENDS][:]
    starts = np.concatenate([[0], ends[:-1]])
    pool = np.concatenate([np.arange(starts[e], ends[e]) for e in stats["split"]["train"]])
    picked = pool[np.linspace(0, len(pool) - 1, 7).round().astype(int)]
    frames = root[layout.RGB][:][picked].astype(np.float64) / 255
    assert image["count"] == 7
    np.testing.assert_allclose(image["mean"], frames.mean(axis=(0, 1, 2)), atol=1e-12)
    np.testing.assert_allclose(image["std"], frames.std(axis=(0, 1, 2)), atol=1e-9)


def test_split_is_seeded_and_never_empty() -> None:
    names = [f"rec_{i:04d}" for i in range(10)]
    assert split_episodes(names, 0, 0.2, 0.2) == split_episodes(names, 0, 0.2, 0.2)
    assert split_episodes(names, 0, 0.2, 0.2) != split_episodes(names, 1, 0.2, 0.2)
    for test_fraction, smallest in ((0.0, 2), (0.2, 3)):
        for n in (smallest, smallest + 1, 50):
            for fraction in (0.01, 0.5, 0.79):
                split = split_episodes([f"r{i}" for i in range(n)], 7, fraction, test_fraction)
                assert split.train and split.val and bool(split.test) == (test_fraction > 0)
                assert sorted(split.train + split.val + split.test) == list(range(n))
    with pytest.raises(ValueError, match="at least 2"):
        split_episodes(["only"], 0, 0.2)
    with pytest.raises(ValueError, match="at least 3.*test_fraction: 0"):
        split_episodes(["a", "b"], 0, 0.2, 0.2)


def test_the_sides_follow_the_hash_positions() -> None:
    """Validation below val_fraction, test up to val_fraction + test_fraction, train above; a test
    side leaves validation as a two-way split of the same seed has it."""
    names = [f"rec_{i:04d}" for i in range(200)]
    split = split_episodes(names, 4, 0.15, 0.2)
    position = [group_fraction(4, n) for n in names]
    assert all(position[i] < 0.15 for i in split.val)
    assert all(0.15 <= position[i] < 0.35 for i in split.test)
    assert all(position[i] >= 0.35 for i in split.train)
    assert split.val == split_episodes(names, 4, 0.15).val
    # About the fractions: 200 draws, 3 standard deviations.
    assert abs(len(split.test) - 40) < 3 * (200 * 0.2 * 0.8) ** 0.5


def test_adding_recordings_never_moves_an_existing_episode_across_the_split(tmp_path: Path) -> None:
    """Through the stage's own entry point: a dataset of 6 episodes, then the same plus 4 more
    (appended, and one inserted first, so indices shift): every old stem stays on its side."""

    def sides(lengths, stems) -> dict[str, str]:
        root = make_store(tmp_path / f"ds{len(stems)}.zarr", lengths=lengths)
        root.attrs[layout.ATTRS_EPISODES] = [
            ep | {"stem": s, "folder": "session_01"}
            for ep, s in zip(root.attrs[layout.ATTRS_EPISODES], stems)
        ]
        split = compute_statistics(root, WINDOW, CONFIG)["split"]
        return {s: side for side in ("train", "val", "test") for s in split[f"{side}_stems"]}

    old_stems = [f"rec_{i:04d}" for i in range(1, 7)]
    before = sides((30, 25, 40, 35, 28, 33), old_stems)
    after = sides(
        (20, 30, 25, 40, 35, 28, 33, 22, 26, 24), ["rec_0000", *old_stems, "rec_0007", "rec_0008", "rec_0009"]
    )
    assert {s: after[s] for s in old_stems} == before
    assert set(before.values()) == {"train", "val", "test"}


def test_a_session_is_held_out_whole() -> None:
    groups = episode_groups([{"stem": f"r{i}", "folder": f"session_{i % 4}"} for i in range(40)], "session")
    split = split_episodes(groups, 0, 0.3, 0.3)
    sides = [{groups[i] for i in side} for side in (split.train, split.val, split.test)]
    assert all(sides) and sum(map(len, sides)) == len(set(groups)) == 4


def test_the_split_rule_is_recorded_with_the_split(store: Path) -> None:
    split = compute_statistics(zarr.open_group(store, mode="r"), WINDOW, CONFIG)["split"]
    assert split["split_by"] == "recording" and split["seed"] == CONFIG.seed and "sha256" in split["rule"]


def test_statistics_are_deterministic_bytes(store: Path) -> None:
    root = zarr.open_group(store, mode="r")
    assert canonical_json(compute_statistics(root, WINDOW, CONFIG)) == canonical_json(
        compute_statistics(root, WINDOW, CONFIG)
    )
