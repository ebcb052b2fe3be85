"""The normalizer, part of the policy's state: saved and loaded with its weights.

Low-dimensional arrays are standardised per dimension with the mean and standard deviation of
the training episodes (the `stats` stage); a dimension that (almost) does not vary is only
centred. Not min/max to [-1, 1]: relative actions are heavy-tailed (far horizon steps move much
more than near ones), and a [-1, 1] range set by the extremes squeezes most of the data near
zero, where the denoiser's residual error is as large as the signal (measured on the demo:
per-dimension std 0.03-0.2 after min/max scaling, and a policy error twice hold-still's).
Images are scaled to [0, 1], then standardised per channel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MIN_STD = 1e-5


class StandardNormalizer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("offset", torch.zeros(dim))

    @torch.no_grad()
    def fit(self, stats: dict[str, Any]) -> None:
        mean = torch.tensor(stats["mean"], dtype=torch.float64)
        std = torch.tensor(stats["std"], dtype=torch.float64)
        scale = torch.where(std > MIN_STD, 1.0 / std.clamp_min(MIN_STD), torch.ones_like(std))
        self.scale.copy_(scale.float())
        self.offset.copy_((-mean * scale).float())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.offset

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.offset) / self.scale


class ImageNormalizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.full((3,), 0.5))
        self.register_buffer("std", torch.full((3,), 0.25))

    @torch.no_grad()
    def fit(self, stats: dict[str, Any]) -> None:
        self.mean.copy_(torch.tensor(stats["mean"], dtype=torch.float32))
        self.std.copy_(torch.tensor(stats["std"], dtype=torch.float32).clamp_min(1e-3))

    def forward(self, images_uint8: torch.Tensor) -> torch.Tensor:
        """(..., H, W, 3) uint8 -> (..., 3, H, W) float, standardised."""
        x = images_uint8.movedim(-1, -3).float() / 255.0
        return (x - self.mean[:, None, None]) / self.std[:, None, None]
