"""Save and load of the exported policy: its modes and outputs survive, an older folder is refused."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from policypipe.atomic import canonical_json, write_folder_atomic
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy, save_policy
from tests.policy.test_diffusion import TINY, batch, fake_stats


@pytest.mark.parametrize(
    "choices",
    [
        dict(normalization="min_max", normalize_actions_per_step=True, timestep_spacing="trailing"),
        dict(
            normalization="mean_std",
            normalize_actions_per_step=False,
            timestep_spacing="leading",
            encoder_stem_pool=False,
        ),
    ],
)
def test_a_loaded_policy_keeps_its_modes_and_predicts_exactly_what_the_saved_one_did(
    tmp_path: Path, choices
) -> None:
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(TINY, **choices))
    policy.fit_normalizers(fake_stats())
    policy.eval()
    save_policy(tmp_path / "policy", policy, {})
    loaded = load_policy(tmp_path / "policy")
    assert {k: getattr(loaded.config, k) for k in choices} == choices
    assert loaded.noise_schedule.clip == (choices["normalization"] == "min_max")
    assert torch.equal(loaded.action_normalizer.scale, policy.action_normalizer.scale)
    data = batch()
    expected = policy.predict_action(data, torch.Generator().manual_seed(4))
    assert torch.equal(loaded.predict_action(data, torch.Generator().manual_seed(4)), expected)


def test_a_policy_saved_before_these_choices_existed_is_refused_with_what_it_lacks(tmp_path: Path) -> None:
    old = asdict(TINY)
    for key in ("num_keypoints", "normalization", "timestep_spacing"):
        del old[key]
    state = {k: v.contiguous() for k, v in DiffusionPolicy(TINY).state_dict().items()}
    write_folder_atomic(
        tmp_path / "old",
        {
            "model.safetensors": lambda p: save_file(state, p),
            "config.json": lambda p: p.write_bytes(canonical_json({"policy": old})),
        },
        extra={"lineage": {}},
    )
    with pytest.raises(ValueError, match="lacks normalization, num_keypoints, timestep_spacing"):
        load_policy(tmp_path / "old")


def test_a_policy_saved_before_grippers_and_cameras_existed_loads_as_one_of_each(tmp_path: Path) -> None:
    old = asdict(TINY)
    for key in ("grippers", "cameras", "shared_camera_encoder", "encoder_stem_pool"):
        del old[key]
    policy = DiffusionPolicy(TINY)
    state = {k: v.contiguous() for k, v in policy.state_dict().items()}
    write_folder_atomic(
        tmp_path / "old",
        {
            "model.safetensors": lambda p: save_file(state, p),
            "config.json": lambda p: p.write_bytes(canonical_json({"policy": old})),
        },
        extra={"lineage": {}},
    )
    loaded = load_policy(tmp_path / "old")
    assert (loaded.config.grippers, loaded.config.cameras, loaded.config.shared_camera_encoder) == (
        1,
        1,
        False,
    )
    assert loaded.config.encoder_stem_pool  # every policy had the stem's max-pool before the field
    assert loaded.config == TINY
