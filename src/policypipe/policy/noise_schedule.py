"""The diffusion's noise levels: DDPM's forward noising for training (Ho et al. 2020) and DDIM's
deterministic reverse step for inference (Song et al. 2021, eta = 0).

Written out here rather than taken from diffusers: these few formulas were all the policy used of
it, and importing diffusers (it imports torch's compiler) took 1.4 of the 3 seconds every stage,
server and smoke run spent starting. The arithmetic is diffusers' own, operation for operation
and in float32 (its DDPMScheduler.add_noise and get_velocity, its DDIMScheduler.set_timesteps and
step with eta 0 and set_alpha_to_one), so policies trained with it train and sample to the same
bits (docs/training.md, "Sampling (DDIM)").

With alpha_bar(t) the fraction of the clean chunk's variance left at diffusion step t (the
cumulative product of 1 - beta), a chunk x at step t is sqrt(alpha_bar) x + sqrt(1 - alpha_bar) e
for Gaussian noise e, and the velocity is sqrt(alpha_bar) e - sqrt(1 - alpha_bar) x.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from policypipe.policy.config import BETA_SCHEDULES, PREDICTION_TYPES, TIMESTEP_SPACINGS

# squaredcos_cap_v2 (Nichol & Dhariwal 2021): alpha_bar follows a squared cosine, each beta capped
# here (the last would be 1, all signal gone in one step), with the small offset that keeps the
# first betas from vanishing.
MAX_BETA = 0.999
COSINE_OFFSET = 0.008
# linear: Ho et al.'s first and last beta.
LINEAR_BETA_RANGE = (1e-4, 0.02)


def betas(schedule: str, steps: int) -> torch.Tensor:
    """(steps,) float32 the noise added at each diffusion step."""
    if schedule == "squaredcos_cap_v2":

        def alpha_bar(t: float) -> float:
            return math.cos((t + COSINE_OFFSET) / (1 + COSINE_OFFSET) * math.pi / 2) ** 2

        ratios = [1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps) for i in range(steps)]
        return torch.tensor([min(r, MAX_BETA) for r in ratios], dtype=torch.float32)
    if schedule == "linear":
        return torch.linspace(*LINEAR_BETA_RANGE, steps, dtype=torch.float32)
    raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {schedule!r}")


class NoiseSchedule:
    """`num_train_timesteps` diffusion steps of `beta_schedule`; DDIM samples with `prediction_type`
    telling what the denoiser outputs, clipping its estimate of the clean chunk to [-1, 1] when
    `clip` (min/max-normalised training chunks lie there). Holds no state between calls: one
    schedule serves concurrent requests."""

    def __init__(
        self, num_train_timesteps: int, beta_schedule: str, prediction_type: str, clip: bool
    ) -> None:
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        self.num_train_timesteps = num_train_timesteps
        self.prediction_type, self.clip = prediction_type, clip
        self.alphas_cumprod = torch.cumprod(1.0 - betas(beta_schedule, num_train_timesteps), dim=0)

    def _levels(self, steps: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sqrt(alpha_bar) and sqrt(1 - alpha_bar) at `steps` (B,), shaped to scale `like` (B, ...)."""
        alpha_bar = self.alphas_cumprod.to(device=like.device, dtype=like.dtype)[steps.to(like.device)]
        shape = (-1,) + (1,) * (like.dim() - 1)
        return (alpha_bar**0.5).reshape(shape), ((1 - alpha_bar) ** 0.5).reshape(shape)

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The chunks `clean` noised to diffusion `steps` (one per chunk) with `noise`."""
        signal, spread = self._levels(steps, clean)
        return signal * clean + spread * noise

    def velocity(self, clean: torch.Tensor, noise: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The v_prediction target of `clean` noised with `noise` at `steps`."""
        signal, spread = self._levels(steps, clean)
        return signal * noise - spread * clean

    def inference_steps(self, count: int, spacing: str) -> list[int]:
        """The diffusion steps DDIM visits, from the noisiest: "trailing" from the last training step
        down by num_train_timesteps / count, "leading" from a multiple of num_train_timesteps // count
        down to 0 (Lin et al. 2024, Table 2, 0-based)."""
        n = self.num_train_timesteps
        if spacing == "trailing":
            return (np.round(np.arange(n, 0, -n / count)).astype(np.int64) - 1).tolist()
        if spacing == "leading":
            return (np.arange(0, count) * (n // count)).round()[::-1].astype(np.int64).tolist()
        raise ValueError(f"timestep_spacing must be one of {TIMESTEP_SPACINGS}, got {spacing!r}")

    def ddim_step(self, output: torch.Tensor, step: int, sample: torch.Tensor, count: int) -> torch.Tensor:
        """The chunk at the next of `count` DDIM steps from `sample` at diffusion `step`, given the
        denoiser's `output` there. It lands num_train_timesteps // count below `step`; below step 0
        it returns the estimate of the clean chunk itself (alpha_bar 1)."""
        below = step - self.num_train_timesteps // count
        alpha_bar = self.alphas_cumprod[step]
        alpha_bar_next = self.alphas_cumprod[below] if below >= 0 else torch.tensor(1.0)
        beta_bar = 1 - alpha_bar
        if self.prediction_type == "epsilon":
            clean = (sample - beta_bar**0.5 * output) / alpha_bar**0.5
            noise = output
        elif self.prediction_type == "sample":
            clean = output
            noise = (sample - alpha_bar**0.5 * clean) / beta_bar**0.5
        else:
            clean = alpha_bar**0.5 * sample - beta_bar**0.5 * output
            noise = alpha_bar**0.5 * output + beta_bar**0.5 * sample
        if self.clip:
            clean = clean.clamp(-1.0, 1.0)
        return alpha_bar_next**0.5 * clean + (1 - alpha_bar_next) ** 0.5 * noise
