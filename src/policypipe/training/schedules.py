"""What changes with the step: the learning rate (linear warm-up, cosine decay) and the EMA of the
weights (docs/training.md, "EMA").
"""

from __future__ import annotations

import math

import torch

from policypipe.training.config import TrainConfig


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def ema_decay(step: int, config: TrainConfig) -> float:
    """The EMA decay of the update after optimizer step `step` (0-based): diffusion_policy's
    `EMAModel.get_decay(step)` (Chi et al.; update_after_step 0). Small early, so the EMA is not
    dominated by the random initialisation; the first two updates copy the weights."""
    s = max(0, step - 1)
    if s == 0:
        return 0.0
    value = 1 - (1 + s / config.ema_inv_gamma) ** -config.ema_power
    return max(config.ema_min_decay, min(value, config.ema_max_decay))


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    torch._foreach_lerp_(list(ema.parameters()), [p.detach() for p in model.parameters()], 1 - decay)
    for e, b in zip(ema.buffers(), model.buffers()):
        e.copy_(b)
