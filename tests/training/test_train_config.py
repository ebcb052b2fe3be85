"""The `train` and `policy` sections are checked before any work starts: a value that cannot
work is refused with the key and the range it must be in, and the run folder is not touched."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from policypipe.config import ConfigError
from policypipe.policy.config import PolicyConfig
from policypipe.training.config import TrainConfig

# The tiny model of conftest.MODEL, as params.yaml sections.
POLICY = {"n_obs_steps": 2, "horizon": 8, "n_action_steps": 4}
TRAIN = {
    "steps": 12,
    "batch_size": 8,
    "lr": 1e-3,
    "warmup_steps": 2,
    "num_workers": 0,
    "val_every": 4,
    "val_batches": 2,
    "checkpoint_every": 4,
    "keep_top_k": 2,
    "model": {
        "image_size": [16, 12],
        "crop_size": [14, 10],
        "encoder_widths": [16, 32],
        "image_feature_dim": 16,
        "down_dims": [16, 32],
        "diffusion_step_embed_dim": 16,
        "num_inference_steps": 4,
    },
}


def sections(train: dict | None = None, policy: dict | None = None) -> tuple[dict, dict]:
    model = TRAIN["model"] | (train or {}).get("model", {})
    return TRAIN | (train or {}) | {"model": model}, POLICY | (policy or {})


def test_the_demo_sections_build() -> None:
    from policypipe.training.config import train_config_from_params

    config = train_config_from_params(*sections())
    assert config.model.horizon == 8 and config.val_every == 4 and config.model.down_dims == (16, 32)


@pytest.mark.parametrize(
    ("train", "policy", "named"),
    [
        ({"val_every": 0}, {}, ["val_every", ">= 1", "got 0"]),
        ({"checkpoint_every": 0}, {}, ["checkpoint_every", ">= 1"]),
        ({"num_processes": 0}, {}, ["num_processes", ">= 1"]),
        ({"lr": math.nan}, {}, ["lr", "finite", "> 0"]),
        ({"lr": math.inf}, {}, ["lr", "finite", "> 0"]),
        ({"lr": -1e-4}, {}, ["lr", "> 0", "-0.0001"]),
        ({"warmup_steps": -1}, {}, ["warmup_steps", ">= 0"]),
        ({"grad_clip": -1.0}, {}, ["grad_clip", "> 0"]),
        ({"keep_top_k": -1}, {}, ["keep_top_k", ">= 0"]),
        ({"export": "first"}, {}, ["train.export", "'first'", "'last', 'best'"]),
        ({"export": "best", "keep_top_k": 0}, {}, ["export 'best'", "keep_top_k >= 1"]),
        ({"min_device_batch": 0}, {}, ["min_device_batch", ">= 1"]),
        ({"num_workers": -1}, {}, ["num_workers", ">= 0"]),
        ({"frame_cache_mb": -1}, {}, ["frame_cache_mb", ">= 0"]),
        ({"channels_last": "yes"}, {}, ["channels_last"]),
        ({"cpu_threads": 0}, {}, ["cpu_threads", ">= 1"]),
        ({"ema_power": 0.0}, {}, ["ema_power", "> 0"]),
        ({"ema_inv_gamma": math.nan}, {}, ["ema_inv_gamma", "> 0"]),
        ({"ema_max_decay": 1.0}, {}, ["ema_max_decay < 1", "got 0.0 and 1.0"]),
        ({"ema_min_decay": 0.5, "ema_max_decay": 0.4}, {}, ["ema_min_decay <= ema_max_decay"]),
        (
            {"model": {"crop_size": [20, 10]}},
            {},
            ["train.model", "crop_size [20, 10]", "at most", "image_size [16, 12]"],
        ),
        # The U-Net halves the horizon len(down_dims) - 1 times: with 3 levels, a multiple of 4.
        (
            {"model": {"down_dims": [16, 32, 64]}},
            {"horizon": 10},
            ["policy.horizon 10", "multiple of 4", "train.model.down_dims"],
        ),
        ({"model": {"down_dims": []}}, {}, ["down_dims must list at least one"]),
        ({}, {"horizon": 9}, ["policy.horizon 9", "multiple of 2"]),
        # The window is the shared `policy` section's: set here, it would be silently overridden.
        ({"model": {"horizon": 32}}, {}, ["train.model.horizon", "[policy]"]),
    ],
)
def test_a_train_config_that_cannot_work_is_refused_naming_the_key_and_range(train, policy, named) -> None:
    from policypipe.training.config import train_config_from_params

    with pytest.raises(ConfigError) as info:
        train_config_from_params(*sections(train, policy))
    for words in named:
        assert words in str(info.value)


@pytest.mark.slow
def test_the_stage_fails_on_a_bad_value_before_touching_the_run_folder(dataset, tmp_path: Path) -> None:
    store, stats = dataset
    train, policy = sections({"val_every": 0})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": train, "policy": policy, "monitor": {}}))
    run_dir = tmp_path / "train"
    kept = run_dir / "checkpoints" / "val_loss-0.50000-step-0000004" / "model.safetensors"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"weights of an earlier run")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))

    stage = Path(__file__).resolve().parents[2] / "stages" / "train.py"
    done = subprocess.run(
        [
            sys.executable,
            str(stage),
            "--dataset",
            str(store),
            "--stats",
            str(stats),
            "--run-dir",
            str(run_dir),
            "--policy",
            "policy",
            "--metrics",
            "train.json",
            "--live",
            "live",
            "--provenance",
            "provenance.json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert (
        "error: params.yaml [train]: val_every must be >= 1" in done.stderr and "Traceback" not in done.stderr
    )
    assert (
        sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    )  # nothing written
    assert kept.read_bytes() == b"weights of an earlier run"
    json.loads(stats.read_text())  # the inputs are untouched too


@pytest.mark.slow
def test_the_stage_refuses_statistics_made_for_another_policy_section(dataset, tmp_path: Path) -> None:
    store, stats = dataset
    train, policy = sections({}, {"horizon": 16})  # stats.json was computed for horizon 8
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": train, "policy": policy, "monitor": {}}))
    stage = Path(__file__).resolve().parents[2] / "stages" / "train.py"
    done = subprocess.run(
        [
            sys.executable,
            str(stage),
            "--dataset",
            str(store),
            "--stats",
            str(stats),
            "--run-dir",
            "train",
            "--policy",
            "policy",
            "--metrics",
            "train.json",
            "--live",
            "live",
            "--provenance",
            "provenance.json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert "'horizon': 8" in done.stderr and "'horizon': 16" in done.stderr and "dvc repro" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "train").exists()


def test_training_refuses_statistics_made_for_another_policy_section_whoever_calls_it(
    dataset, tmp_path: Path
) -> None:
    """The library checks too: `policypipe smoke` and scripts call `train()` without the stage."""
    from policypipe.training.config import train_config_from_params
    from policypipe.training.loop import train

    store, stats_path = dataset
    config = train_config_from_params(*sections({}, {"horizon": 16}))  # the statistics are for horizon 8
    with pytest.raises(ConfigError, match=r"'horizon': 8.*'horizon': 16"):
        train(
            store=store,
            stats=json.loads(stats_path.read_text()),
            stats_sha256="0" * 64,
            config=config,
            run_dir=tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()


def test_the_privileged_control_is_named_by_its_export_and_its_observation_is_not_a_model_size() -> None:
    from policypipe.training.config import PrivilegedExport, train_config_from_params

    config = train_config_from_params(TRAIN | {"privileged": {"seed": 3, "recordings": 4}}, POLICY)
    assert config.privileged == PrivilegedExport(seed=3, recordings=4, recovery=0.0)
    assert train_config_from_params(TRAIN, POLICY).privileged is None
    with pytest.raises(ConfigError, match="train.model.scene_state_dim is set by train.privileged"):
        train_config_from_params(TRAIN | {"model": TRAIN["model"] | {"scene_state_dim": 8}}, POLICY)
    with pytest.raises(ConfigError, match="train.privileged.seed: expected an integer"):
        train_config_from_params(TRAIN | {"privileged": {"seed": "zero"}}, POLICY)


def test_pretraining_the_encoder_needs_the_event_loss_and_freezing_it_needs_pretraining() -> None:
    with pytest.raises(ValueError, match="set model.event_loss_weight > 0 too"):
        TrainConfig(encoder_pretrain_steps=10)
    with pytest.raises(ValueError, match="or it would keep a random one"):
        TrainConfig(freeze_encoder=True, model=PolicyConfig(event_loss_weight=1.0))
    with pytest.raises(ValueError, match="encoder_pretrain_steps must be >= 0"):
        TrainConfig(encoder_pretrain_steps=-1, model=PolicyConfig(event_loss_weight=1.0))
    config = TrainConfig(
        encoder_pretrain_steps=10, freeze_encoder=True, model=PolicyConfig(event_loss_weight=1.0)
    )
    assert replace(config, freeze_encoder=False).encoder_pretrain_steps == 10


def test_a_negative_deadband_is_refused_and_the_params_value_reaches_the_config() -> None:
    from policypipe.training.config import train_config_from_params

    with pytest.raises(ValueError, match="open_deadband_mm must be >= 0"):
        TrainConfig(open_deadband_mm=-1.0)
    assert train_config_from_params(TRAIN | {"open_deadband_mm": 8.0}, POLICY).open_deadband_mm == 8.0
