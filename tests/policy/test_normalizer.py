"""The low-dimensional normalizer in both modes: where the training statistics go, the way back,
and dimensions that do not vary."""

from __future__ import annotations

import pytest
import torch

from policypipe.policy.normalizer import LowDimNormalizer

# One stats.json `lowdim` entry: the second dimension is constant over the training episodes.
STATS = {
    "count": 100,
    "min": [-0.3, 0.05, 2.0],
    "max": [0.1, 0.05, 6.0],
    "mean": [-0.05, 0.05, 3.0],
    "std": [0.08, 0.0, 1.5],
    "q01": [-0.28, 0.05, 2.1],
    "q99": [0.09, 0.05, 5.8],
}


def fitted(mode: str) -> LowDimNormalizer:
    normalizer = LowDimNormalizer(3, mode)
    normalizer.fit(STATS)
    return normalizer


def test_min_max_maps_the_training_min_and_max_to_minus_and_plus_one_and_back() -> None:
    normalizer = fitted("min_max")
    low, high = torch.tensor([STATS["min"]]), torch.tensor([STATS["max"]])
    assert torch.allclose(normalizer.normalize(low)[:, [0, 2]], torch.tensor([[-1.0, -1.0]]), atol=1e-6)
    assert torch.allclose(normalizer.normalize(high)[:, [0, 2]], torch.tensor([[1.0, 1.0]]), atol=1e-6)
    assert torch.allclose(normalizer.normalize((low + high) / 2)[:, [0, 2]], torch.zeros(1, 2), atol=1e-6)
    x = torch.tensor([[-0.5, 0.05, 3.3], [0.0, 0.06, 7.0]])  # inside and outside the training range
    assert torch.allclose(normalizer.unnormalize(normalizer.normalize(x)), x, atol=1e-6)


def test_mean_std_standardises_with_the_training_mean_and_std() -> None:
    normalizer = fitted("mean_std")
    mean, std = torch.tensor(STATS["mean"]), torch.tensor(STATS["std"])
    assert torch.allclose(normalizer.normalize(mean + std)[[0, 2]], torch.tensor([1.0, 1.0]), atol=1e-6)
    assert torch.allclose(normalizer.normalize(mean)[[0, 2]], torch.zeros(2), atol=1e-6)


@pytest.mark.parametrize("mode", ["min_max", "mean_std"])
def test_a_dimension_that_does_not_vary_is_only_centred(mode: str) -> None:
    normalizer = fitted(mode)
    constant = torch.tensor([[0.0, 0.05, 3.0], [0.0, 0.06, 3.0], [0.0, 0.03, 3.0]])
    # Centred on the training value, differences kept as they are (scale 1, not 1 / 0).
    assert torch.allclose(normalizer.normalize(constant)[:, 1], torch.tensor([0.0, 0.01, -0.02]), atol=1e-6)


def test_an_unknown_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="normalization must be one of"):
        LowDimNormalizer(3, "quantile")
