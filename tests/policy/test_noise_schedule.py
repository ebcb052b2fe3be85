"""The noise schedule against the closed forms it discretises (sampling with it: test_diffusion.py)."""

from __future__ import annotations

import math

import pytest
import torch

from policypipe.policy.config import PolicyConfig
from policypipe.policy.noise_schedule import LINEAR_BETA_RANGE, MAX_BETA, NoiseSchedule, betas


def test_the_squared_cosine_schedule_leaves_the_cosines_share_of_the_signal_at_each_step() -> None:
    steps = 100
    schedule = NoiseSchedule(steps, "squaredcos_cap_v2", "epsilon", clip=True)

    def f(t: float) -> float:  # Nichol & Dhariwal's alpha_bar, before normalising by f(0)
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    expected = torch.tensor([f((t + 1) / steps) / f(0) for t in range(steps - 1)])
    # Every step but the last, whose beta the cap holds below 1 (the cosine reaches 0 there).
    assert torch.allclose(schedule.alphas_cumprod[:-1], expected.float(), rtol=1e-4, atol=1e-7)
    assert betas("squaredcos_cap_v2", steps).max().item() == pytest.approx(MAX_BETA)
    assert 0 < schedule.alphas_cumprod[-1].item() < 1e-3  # next to pure noise, not past it


def test_the_linear_schedule_runs_from_ho_et_als_first_beta_to_their_last() -> None:
    linear = betas("linear", 1000)
    assert (linear[0].item(), linear[-1].item()) == pytest.approx(LINEAR_BETA_RANGE)
    assert torch.all(linear[1:] > linear[:-1])


def test_a_noised_chunk_and_its_velocity_give_back_the_chunk_and_the_noise() -> None:
    schedule = NoiseSchedule(100, "squaredcos_cap_v2", "v_prediction", clip=False)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randn((4, 16, 10), generator=generator)
    noise = torch.randn((4, 16, 10), generator=generator)
    steps = torch.tensor([0, 10, 50, 99])
    noisy = schedule.add_noise(clean, noise, steps)
    velocity = schedule.velocity(clean, noise, steps)
    signal = schedule.alphas_cumprod[steps].sqrt().view(-1, 1, 1)
    spread = (1 - schedule.alphas_cumprod[steps]).sqrt().view(-1, 1, 1)
    # (noisy, velocity) is (clean, noise) turned by the angle whose cosine is `signal`.
    assert torch.allclose(signal * noisy - spread * velocity, clean, atol=1e-5)
    assert torch.allclose(spread * noisy + signal * velocity, noise, atol=1e-5)
    # Step 0 is almost all signal, step 99 almost all noise.
    assert spread[0].item() < 0.03 and signal[-1].item() < 0.03


def test_inference_steps_leave_the_schedule_as_it_was_for_the_next_caller() -> None:
    """Sampling with one step count leaves nothing behind for the next with another (diffusers' DDIM
    scheduler kept the count of its last `set_timesteps`)."""
    schedule = NoiseSchedule(100, "squaredcos_cap_v2", "epsilon", clip=True)
    assert schedule.inference_steps(4, "trailing") == [99, 74, 49, 24]
    assert schedule.inference_steps(20, "leading")[:3] == [95, 90, 85]
    assert schedule.inference_steps(4, "trailing") == [99, 74, 49, 24]


def test_an_unknown_beta_schedule_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"beta_schedule must be one of \('squaredcos_cap_v2', 'linear'\)"):
        PolicyConfig(beta_schedule="scaled_linear")
