"""The image encoder: spatial-softmax keypoints against their analytic values, and the shapes of
both poolings at the demo's and the real-robot sizes."""

from __future__ import annotations

import math

import pytest
import torch

from policypipe.policy.config import PolicyConfig, encoder_feature_map_size
from policypipe.policy.encoder import ImageEncoder, SpatialSoftmax


def test_each_keypoint_is_the_expected_position_of_its_softmax_map() -> None:
    # Two channels, each one peak of height a on a 4-row x 5-column map of zeros; keypoint k reads
    # channel k alone. On robomimic's grid (x: linspace(-1, 1, 5) per column, y: linspace(-1, 1, 4)
    # per row) every row and column sums to zero, so with N = 20 positions the softmax mean is
    # peak * (e^a - 1) / (e^a + N - 1).
    a, n = 3.0, 20
    features = torch.zeros(1, 2, 4, 5)
    features[0, 0, 1, 3] = a  # x 0.5, y -1/3
    features[0, 1, 3, 0] = a  # x -1, y 1
    pool = SpatialSoftmax(channels=2, num_keypoints=2)
    with torch.no_grad():
        pool.keypoint_maps.weight.copy_(torch.eye(2).view(2, 2, 1, 1))
        pool.keypoint_maps.bias.zero_()
    shrink = (math.exp(a) - 1) / (math.exp(a) + n - 1)
    expected = torch.tensor([[0.5, -1 / 3, -1.0, 1.0]]) * shrink  # [x_0, y_0, x_1, y_1]
    assert torch.allclose(pool(features), expected, atol=1e-6)
    # A dominant peak: the keypoint is the peak's position itself.
    assert torch.allclose(pool(features * 30), torch.tensor([[0.5, -1 / 3, -1.0, 1.0]]), atol=1e-6)


@pytest.mark.parametrize(
    ("widths", "crop", "stem_pool", "feature_map"),
    [
        ((16, 32, 64, 128), (56, 56), True, (2, 2)),  # the demo (params.yaml)
        ((16, 32, 64), (56, 56), False, (7, 7)),  # the demo's crop, no stem pool, three stages
        ((16, 32, 64, 128), (88, 88), True, (3, 3)),  # the earlier demo: 3x3, as the reference's 84x84
        ((64, 128, 256, 512), (88, 88), True, (3, 3)),  # PolicyConfig's default, real-robot widths
        (
            (64, 128, 256, 512),
            (216, 216),
            True,
            (7, 7),
        ),  # a 224 x 224 camera (tests/benchmarks/bench_train.py)
    ],
)
def test_feature_map_and_features_have_the_documented_sizes(widths, crop, stem_pool, feature_map) -> None:
    assert encoder_feature_map_size(crop, widths, stem_pool) == feature_map
    encoder = ImageEncoder(widths, feature_dim=64, num_keypoints=32, stem_pool=stem_pool)
    images = torch.randn(2, 3, crop[1], crop[0])
    with torch.no_grad():
        last = encoder.stages(encoder.stem(images))
        assert last.shape == (2, widths[-1], feature_map[1], feature_map[0])
        assert encoder.pool(last).shape == (2, 2 * 32)
        assert encoder(images).shape == (2, 64)


def test_feature_map_size_rounds_up_per_halving_for_a_non_square_crop() -> None:
    encoder = ImageEncoder((16, 32), feature_dim=8, num_keypoints=4)
    with torch.no_grad():
        last = encoder.stages(encoder.stem(torch.zeros(1, 3, 10, 14)))  # crop (width 14, height 10)
    assert encoder_feature_map_size((14, 10), (16, 32)) == (last.shape[-1], last.shape[-2]) == (2, 2)


def test_an_encoder_without_the_stem_pool_loads_the_weights_of_one_with_it() -> None:
    # The pool has no weights: the same state dict, a map twice as fine in each direction.
    pooled = ImageEncoder((16, 32), feature_dim=8, num_keypoints=4)
    unpooled = ImageEncoder((16, 32), feature_dim=8, num_keypoints=4, stem_pool=False)
    unpooled.load_state_dict(pooled.state_dict())
    images = torch.randn(1, 3, 24, 24)
    with torch.no_grad():
        assert pooled.stages(pooled.stem(images)).shape[-2:] == (3, 3)
        assert unpooled.stages(unpooled.stem(images)).shape[-2:] == (6, 6)


def test_spatial_softmax_on_a_one_by_one_map_is_refused_with_what_to_change() -> None:
    with pytest.raises(ValueError, match="larger than 1x1.*use a larger crop or fewer stages"):
        PolicyConfig(image_size=(32, 32), crop_size=(32, 32), encoder_widths=(16, 32, 64, 128))
    PolicyConfig(image_size=(32, 32), crop_size=(32, 32), encoder_widths=(16, 32, 64))
    PolicyConfig(
        image_size=(32, 32), crop_size=(32, 32), encoder_widths=(16, 32, 64, 128), encoder_stem_pool=False
    )
