"""The training benchmark: the CPU comparison of `make bench`, and `make bench-gpu`'s refusal on a
machine without CUDA and its recipe."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
import yaml
import zarr

from policypipe.config import from_mapping
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.config import PolicyConfig
from policypipe.training.config import train_config_from_params
from tests.benchmarks.bench_train import REAL_ROBOT, compare_paths
from tests.conftest import REPO_ROOT
from tests.dataset.conftest import make_store
from tests.training.conftest import CONFIG, WINDOW


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the benchmark would run")
def test_bench_gpu_refuses_in_one_line_without_cuda(tmp_path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench_train", "--gpu"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("bench_train --gpu: no CUDA device here")
    assert "a CUDA build of torch" in done.stderr
    assert not list(tmp_path.glob("policypipe-bench-*"))  # refused before building its dataset
    assert time.monotonic() - started < 60


def test_the_real_robot_recipe_is_params_yaml_with_the_real_robot_model() -> None:
    """What `make bench-gpu` trains, checked here where it cannot run: a valid train config of the
    real-robot size, with the train stage's windows (params.yaml's policy section), which the
    benchmark also computes its statistics with."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    config = train_config_from_params(params["train"] | REAL_ROBOT, params["policy"])
    assert (config.batch_size, config.mixed_precision, config.num_workers) == (64, "bf16", 8)
    assert config.model.image_size == (224, 224) and config.model.crop_size == (216, 216)
    real_robot = PolicyConfig()
    assert (config.model.encoder_widths, config.model.down_dims) == (
        real_robot.encoder_widths,
        real_robot.down_dims,
    )
    assert config.window == from_mapping(WindowConfig, params["policy"], "policy")
    assert config.model.n_obs_steps == config.window.n_obs_steps
    # The demo's recipe at that size: the encoder taught the grasps and releases, then frozen.
    assert config.model.event_labels and config.encoder_pretrain_steps > 0 and config.freeze_encoder


def test_make_bench_trains_the_earlier_path_and_params_yamls_in_one_run(tmp_path, capsys) -> None:
    """The CPU comparison `make bench` prints, on the unit tests' tiny model for a few steps."""
    make_store(tmp_path / "ds.zarr")
    stats = compute_statistics(zarr.open_group(tmp_path / "ds.zarr", mode="r"), WINDOW, StatsConfig())
    stats["dataset_fingerprint"] = {"sha256": "f" * 64}
    config = replace(CONFIG, steps=3, val_every=10**9, checkpoint_every=10**9, keep_top_k=0)
    compare_paths(tmp_path / "ds.zarr", stats, config, tmp_path, rounds=1)
    out = capsys.readouterr().out
    assert "earlier path (channels_last False, fused_adamw False, frame_cache_mb 0):" in out
    assert "params.yaml's path (channels_last True, fused_adamw True, frame_cache_mb 1024):" in out
    assert out.count("model: forward and backward") == 2
    assert "params.yaml's path / earlier path, samples/s:" in out
