"""The normalizer, part of the policy's state: saved and loaded with its weights.

Low-dimensional arrays are mapped to [-1, 1] from their min and max over the training
episodes (the `stats` stage); a dimension with (almost) no range is only centred. Images are
scaled to [0, 1], then standardised per channel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MIN_RANGE = 1e-4


class RangeNormalizer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("offset", torch.zeros(dim))

    @torch.no_grad()
    def fit(self, stats: dict[str, Any]) -> None:
        lo = torch.tensor(stats["min"], dtype=torch.float32)
        hi = torch.tensor(stats["max"], dtype=torch.float32)
        span = hi - lo
        scale = torch.where(span > MIN_RANGE, 2.0 / span.clamp_min(MIN_RANGE), torch.ones_like(span))
        self.scale.copy_(scale)
        self.offset.copy_(-(lo + hi) / 2 * scale)

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
