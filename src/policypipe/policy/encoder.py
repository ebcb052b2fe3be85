"""A ResNet-18-style image encoder with GroupNorm, trained from scratch (nothing downloaded).

GroupNorm instead of BatchNorm: statistics do not depend on the batch, so EMA weights and
small per-device batches behave (Chi et al. replace BatchNorm the same way).

The last feature map (B, C, h, w), the crop halved by the stem's convolution, by its max-pool
(unless stem_pool is off) and by each stage after the first (config.encoder_feature_map_size:
3x3 for an 88x88 crop and four stages, as the reference's ResNet-18 on 84x84), becomes K
spatial-softmax keypoints (Chi et al., after robomimic: where in the image each of K learned
features is, (B, 2K)); a linear layer maps them to feature_dim.
"""

from __future__ import annotations

import torch
from torch import nn


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(max(1, channels // 16), channels)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = _norm(c_out)
        self.skip = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), _norm(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(y)) + self.skip(x))


class SpatialSoftmax(nn.Module):
    """(B, C, h, w) features -> (B, 2K) keypoints [x_0, y_0, x_1, y_1, ...].

    A 1x1 convolution makes K maps; a softmax over the h x w positions (temperature 1, as the
    reference) turns each into a distribution, whose mean position is the keypoint. Positions
    are on robomimic's grid: x from -1 (left column) to +1 (right), y from -1 (top row) to +1.
    """

    def __init__(self, channels: int, num_keypoints: int) -> None:
        super().__init__()
        self.keypoint_maps = nn.Conv2d(channels, num_keypoints, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.keypoint_maps(features)  # (B, K, h, w)
        h, w = maps.shape[-2:]
        attention = maps.flatten(2).softmax(dim=-1).view_as(maps)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device, dtype=attention.dtype)
        ys = torch.linspace(-1.0, 1.0, h, device=maps.device, dtype=attention.dtype)
        x = (attention.sum(dim=-2) * xs).sum(dim=-1)  # column marginal (B, K, w) -> (B, K)
        y = (attention.sum(dim=-1) * ys).sum(dim=-1)  # row marginal (B, K, h) -> (B, K)
        return torch.stack([x, y], dim=-1).flatten(1)


class ImageEncoder(nn.Module):
    """(B, 3, H, W) normalised images -> (B, feature_dim)."""

    def __init__(
        self, widths: tuple[int, ...], feature_dim: int, num_keypoints: int, stem_pool: bool = True
    ) -> None:
        super().__init__()
        stem = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), _norm(widths[0]), nn.ReLU()]
        # The pool has no weights: a policy saved with it loads the same state dict without it.
        self.stem = nn.Sequential(*stem, *([nn.MaxPool2d(3, 2, 1)] if stem_pool else []))
        stages, c_in = [], widths[0]
        for i, c_out in enumerate(widths):  # two blocks a stage, as ResNet-18
            stages += [BasicBlock(c_in, c_out, 1 if i == 0 else 2), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = SpatialSoftmax(widths[-1], num_keypoints)
        self.head = nn.Linear(2 * num_keypoints, feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.stages(self.stem(images))))
