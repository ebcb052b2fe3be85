"""The nearest-neighbour baseline on a tiny real store: known neighbours, averaged chunks, rotations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import WindowConfig, rot6d
from policypipe.evaluation import nearest_neighbour
from policypipe.evaluation.evaluate import EvalConfig
from policypipe.evaluation.nearest_neighbour import (
    NearestNeighbourConfig,
    NearestNeighbourIndex,
    average_chunks,
    nearest,
)
from policypipe.evaluation.samples import collect_samples
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=2, horizon=6, n_action_steps=3)
EQUAL = {"pose": 1.0, "width": 1.0, "pixels": 1.0}
TRAIN = [0, 1, 2]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    make_store(tmp_path / "ds.zarr", lengths=(30, 25, 40, 35))
    return tmp_path / "ds.zarr"


def baseline_on(
    store: Path, observed: list[int], config: NearestNeighbourConfig
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(the baseline's chunks, the recorded chunks, its cost) on every anchor of the `observed` episodes."""
    b = collect_samples(store, observed, WINDOW, stride=1).batch
    index = NearestNeighbourIndex.build(store, TRAIN, WINDOW, config)
    chunks, search_s = index.chunks_for(
        b["obs_pose"].double().numpy(), b["obs_width"].double().numpy(), b["obs_images"][:, -1].numpy()
    )
    return chunks, b["action"].double().numpy(), {"build_s": index.build_s, "predict_s": search_s}


def run(store: Path, observed: list[int], k: int, weights=EQUAL) -> tuple[np.ndarray, np.ndarray]:
    """(the baseline's chunks, the recorded chunks) on every anchor of the `observed` episodes."""
    chunks, recorded, _ = baseline_on(
        store, observed, NearestNeighbourConfig(k, weights, image_size=4, train_stride=1)
    )
    return chunks, recorded


def test_an_observation_seen_in_training_gets_exactly_its_chunk_with_k_1(store: Path) -> None:
    chunks, recorded = run(store, TRAIN, k=1)
    # float32 is how the samples hold the recorded chunks.
    np.testing.assert_allclose(chunks, recorded, atol=1e-6)


def test_k_neighbours_average_to_an_orthonormal_rotation_unlike_the_recorded_one(store: Path) -> None:
    chunks, recorded = run(store, [3], k=5)
    a, b = chunks[..., 3:6], chunks[..., 6:9]
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(b, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.sum(a * b, axis=-1), 0.0, atol=1e-12)
    assert np.abs(chunks - recorded).max() > 1e-4  # an unseen episode: a guess, not a copy


def test_the_mean_of_two_opposite_turns_is_no_turn_and_widths_average() -> None:
    turns = Rotation.from_euler("z", [[20], [-20]], degrees=True).as_matrix()
    chunks = np.zeros((1, 2, 1, 10))
    chunks[0, :, 0, :3] = [[0.01, 0, 0], [0.03, 0, 0]]
    chunks[0, :, 0, 3:9] = rot6d(turns)
    chunks[0, :, 0, 9] = [0.002, 0.004]
    mean = average_chunks(chunks)[0, 0]
    np.testing.assert_allclose(mean[:3], [0.02, 0, 0], atol=1e-15)
    np.testing.assert_allclose(mean[3:9], [1, 0, 0, 0, 1, 0], atol=1e-15)
    assert mean[9] == pytest.approx(0.003)


def test_neighbours_are_nearest_first_and_ties_go_to_the_lower_index() -> None:
    train = np.array([[0.0], [3.0], [1.0], [1.0], [-2.0]])
    assert nearest(train, np.array([[1.0], [2.4]]), k=3).tolist() == [[2, 3, 0], [1, 2, 3]]
    assert nearest(train, np.array([[0.0]]), k=10).shape == (1, 5)  # k beyond the training windows


def test_a_block_of_weight_zero_is_ignored(store: Path) -> None:
    """With the pixels weighted 0, a frame that differs changes nothing; weighted, it does."""
    samples = collect_samples(store, [3], WINDOW, stride=1)
    b = samples.batch
    pose, width = b["obs_pose"].double().numpy(), b["obs_width"].double().numpy()
    frames = b["obs_images"][:, -1].numpy()
    config = NearestNeighbourConfig(3, {"pose": 1.0, "width": 1.0, "pixels": 0.0}, 4, 1)
    index = NearestNeighbourIndex.build(store, TRAIN, WINDOW, config)
    original, _ = index.chunks_for(pose, width, frames)
    inverted, _ = index.chunks_for(pose, width, 255 - frames)
    np.testing.assert_array_equal(original, inverted)
    only_pixels = NearestNeighbourConfig(3, {"pose": 0.0, "width": 0.0, "pixels": 1.0}, 4, 1)
    index = NearestNeighbourIndex.build(store, TRAIN, WINDOW, only_pixels)
    seen, _ = index.chunks_for(pose, width, frames)
    unseen, _ = index.chunks_for(pose, width, 255 - frames)
    assert not np.array_equal(seen, unseen)


def test_same_inputs_give_the_same_bytes_and_the_cost_in_seconds(store: Path) -> None:
    first, _ = run(store, [3], k=4)
    again, _ = run(store, [3], k=4)
    assert first.tobytes() == again.tobytes()
    _, _, cost = baseline_on(store, [3], NearestNeighbourConfig(4, EQUAL, 4, 2))
    assert set(cost) == {"build_s", "predict_s"} and all(s >= 0 for s in cost.values())


@pytest.mark.parametrize(
    "change", [{"nn_k": 0}, {"nn_image_size": 0}, {"nn_train_stride": 0}, {"nn_pixel_weight": -1.0}]
)
def test_a_config_that_cannot_work_is_refused_before_any_work(change) -> None:
    with pytest.raises(ValueError, match="nearest neighbour"):
        EvalConfig(**change)


def test_the_training_frames_are_read_and_pooled_a_chunk_at_a_time_to_the_same_index(
    store: Path, monkeypatch
) -> None:
    # A whole training side pooled at once took 13 GB for the 480-recording export (a float64 copy
    # of every frame): the index is built POOL_CHUNK frames at a time, to the same bits.
    config = NearestNeighbourConfig(3, EQUAL, image_size=4, train_stride=1)
    whole = NearestNeighbourIndex.build(store, TRAIN, WINDOW, config)
    pooled_at_once, pool = [], torch.nn.functional.adaptive_avg_pool2d

    def counted(x: torch.Tensor, size: int) -> torch.Tensor:
        pooled_at_once.append(len(x))
        return pool(x, size)

    monkeypatch.setattr(torch.nn.functional, "adaptive_avg_pool2d", counted)
    monkeypatch.setattr(nearest_neighbour, "POOL_CHUNK", 7)
    chunked = NearestNeighbourIndex.build(store, TRAIN, WINDOW, config)
    assert max(pooled_at_once) == 7 and sum(pooled_at_once) == len(whole.features) > 7
    assert np.array_equal(chunked.features, whole.features) and np.array_equal(chunked.chunks, whole.chunks)
