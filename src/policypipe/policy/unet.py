"""The conditional 1-D temporal U-Net that denoises an action sequence: it outputs what
`prediction_type` names (the noise, the clean sequence or the velocity).

Shapes: B batch, T horizon, A action dim, C global condition dim. Each residual block is
modulated by FiLM (a per-channel scale and bias computed from the diffusion step embedding
and the observation features).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # (B,) -> (B, dim)
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / (half - 1))
        angles = t.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Conv1dBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, groups: int) -> None:
        super().__init__(
            nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.GroupNorm(groups, c_out), nn.Mish()
        )


class FiLMResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel: int, groups: int) -> None:
        super().__init__()
        self.block1 = Conv1dBlock(c_in, c_out, kernel, groups)
        self.block2 = Conv1dBlock(c_out, c_out, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out))
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:  # x (B, c_in, T)
        scale, bias = self.film(cond).unsqueeze(-1).chunk(2, dim=1)
        y = self.block1(x) * scale + bias
        return self.block2(y) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    def __init__(
        self,
        action_dim: int,
        cond_dim: int,
        down_dims: tuple[int, ...],
        step_dim: int,
        kernel: int,
        groups: int,
    ) -> None:
        super().__init__()
        self.step_embedding = nn.Sequential(
            SinusoidalEmbedding(step_dim),
            nn.Linear(step_dim, 4 * step_dim),
            nn.Mish(),
            nn.Linear(4 * step_dim, step_dim),
        )
        c = step_dim + cond_dim
        dims = [action_dim, *down_dims]
        self.down = nn.ModuleList()
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == len(dims) - 2
            self.down.append(
                nn.ModuleList(
                    [
                        FiLMResidualBlock(d_in, d_out, c, kernel, groups),
                        FiLMResidualBlock(d_out, d_out, c, kernel, groups),
                        nn.Conv1d(d_out, d_out, 3, 2, 1) if not last else nn.Identity(),
                    ]
                )
            )
        mid = down_dims[-1]
        self.mid = nn.ModuleList(
            [FiLMResidualBlock(mid, mid, c, kernel, groups), FiLMResidualBlock(mid, mid, c, kernel, groups)]
        )
        self.up = nn.ModuleList()
        for _i, (d_out, d_in) in enumerate(zip(reversed(down_dims[:-1]), reversed(down_dims[1:]))):
            self.up.append(
                nn.ModuleList(
                    [
                        FiLMResidualBlock(2 * d_in, d_out, c, kernel, groups),
                        FiLMResidualBlock(d_out, d_out, c, kernel, groups),
                        nn.ConvTranspose1d(d_out, d_out, 4, 2, 1),
                    ]
                )
            )
        self.final = nn.Sequential(
            Conv1dBlock(down_dims[0], down_dims[0], kernel, groups), nn.Conv1d(down_dims[0], action_dim, 1)
        )

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor
    ) -> torch.Tensor:
        """sample (B, T, A), timestep (B,), global_cond (B, C) -> predicted noise (B, T, A)."""
        x = sample.transpose(1, 2)
        cond = torch.cat([self.step_embedding(timestep), global_cond], dim=-1)
        skips = []
        for block1, block2, downsample in self.down:
            x = block2(block1(x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for block in self.mid:
            x = block(x, cond)
        for block1, block2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(block2(block1(x, cond), cond))
        return self.final(x).transpose(1, 2)
