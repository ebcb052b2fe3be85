"""The normalizer, part of the policy's state: saved and loaded with its weights.

Each low-dimensional array (observed poses, observed width, actions) is mapped per dimension by
y = x * scale + offset, fitted on the training episodes' statistics (the `stats` stage), in the
mode `PolicyConfig.normalization` names:
- "min_max": the training minimum goes to -1 and the maximum to +1 (the reference
  implementations' default). Values outside the training range map outside [-1, 1] and are not
  clipped here; the policy clips its predicted clean action chunk to [-1, 1] while sampling
  (diffusion.py), so its actions stay within the training minimum and maximum.
- "mean_std": standardised with the training mean and standard deviation; unbounded, so the
  policy does not clip.
A dimension that (almost) does not vary (range below MIN_RANGE, or standard deviation below
MIN_STD) is only centred (scale 1): dividing by its spread would blow rounding noise up to the
size of a real signal.
Images are scaled to [0, 1], then standardised per channel, in both modes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from policypipe.policy.config import NORMALIZATIONS

MIN_STD = 1e-5
# The reference's (diffusion_policy) range below which a dimension counts as constant.
MIN_RANGE = 1e-4


class LowDimNormalizer(nn.Module):
    def __init__(self, dim: int, mode: str) -> None:
        super().__init__()
        if mode not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {mode!r}")
        self.mode = mode
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("offset", torch.zeros(dim))

    @torch.no_grad()
    def fit(self, stats: dict[str, Any]) -> None:
        """`stats`: one entry of stats.json's `lowdim` (per-dimension lists: min, max, mean, std, ...)."""
        if self.mode == "min_max":
            low = torch.tensor(stats["min"], dtype=torch.float64)
            high = torch.tensor(stats["max"], dtype=torch.float64)
            centre, spread, varies = (low + high) / 2, (high - low) / 2, high - low > MIN_RANGE
        else:
            centre = torch.tensor(stats["mean"], dtype=torch.float64)
            spread = torch.tensor(stats["std"], dtype=torch.float64)
            varies = spread > MIN_STD
        scale = 1.0 / torch.where(varies, spread, torch.ones_like(spread))
        self.scale.copy_(scale.float())
        self.offset.copy_((-centre * scale).float())

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
        """(..., H, W, 3) uint8 -> (..., 3, H, W) float, standardised (a channel-last layout)."""
        return self.channel_first(images_uint8.movedim(-1, -3))

    def channel_first(self, images_uint8: torch.Tensor) -> torch.Tensor:
        """(..., 3, H, W) uint8 -> float, standardised, in the layout the images have."""
        x = images_uint8.float() / 255.0
        return (x - self.mean[:, None, None]) / self.std[:, None, None]
