"""A ResNet-18-style image encoder with GroupNorm, trained from scratch (nothing downloaded).

GroupNorm instead of BatchNorm: statistics do not depend on the batch, so EMA weights and
small per-device batches behave (Chi et al. replace BatchNorm the same way).
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


class ImageEncoder(nn.Module):
    """(B, 3, H, W) normalised images -> (B, feature_dim)."""

    def __init__(self, widths: tuple[int, ...], feature_dim: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), _norm(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        stages, c_in = [], widths[0]
        for i, c_out in enumerate(widths):  # two blocks a stage, as ResNet-18
            stages += [BasicBlock(c_in, c_out, 1 if i == 0 else 2), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(widths[-1], feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))
        return self.head(x.mean(dim=(-2, -1)))
