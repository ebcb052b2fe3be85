from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from policypipe.atomic import write_folder_atomic
from policypipe.training.smoke import (
    GPU_SCALAR_RTOL,
    GPU_WEIGHT_RTOL,
    compare_records,
    compare_weights,
    run_smoke,
)
from tests.training.conftest import CONFIG


@pytest.mark.slow
def test_smoke_passes_on_a_sound_setup(dataset) -> None:
    store, stats = dataset
    report = run_smoke(store, stats, CONFIG, steps=6)
    assert report.ok, report.problems
    assert report.resumed_at == 3 and report.peak_rss_mb > 0
    assert report.comparison == "bitwise"  # no GPU here


@pytest.mark.slow
def test_smoke_fails_when_the_restored_state_is_incomplete(dataset) -> None:
    store, stats = dataset

    def forget_the_training_generator(run_dir: Path) -> None:
        # A checkpoint that restores everything but the generator behind noise and crops,
        # with a manifest that matches: only the continuation can tell.
        latest = run_dir / "checkpoints" / "latest"
        files = {p.name: p.read_bytes() for p in latest.iterdir() if p.name != "manifest.json"}
        rng = load_file(latest / "rng.safetensors")
        rng["rank0.train_generator"] = torch.Generator().manual_seed(12345).get_state()
        writers = {name: (lambda p, data=data: p.write_bytes(data)) for name, data in files.items()}
        writers["rng.safetensors"] = lambda p: save_file(rng, p)
        write_folder_atomic(latest, writers)

    report = run_smoke(store, stats, CONFIG, steps=6, between=forget_the_training_generator)
    assert not report.ok
    assert "after resuming at step 3" in report.problems[0]


def records(loss: float) -> list[dict]:
    return [
        {"step": 1, "lr": 1e-3, "train_loss": 0.5},
        {"step": 2, "lr": 1e-3, "train_loss": loss, "val_loss": 0.25},
    ]


def test_smoke_compares_bitwise_on_cpu_and_within_the_stated_tolerance_on_a_gpu() -> None:
    # GPU kernels are not bitwise reproducible: kernel-order noise must pass there, and only there.
    noise = 0.5 * (1 + GPU_SCALAR_RTOL / 10)
    assert compare_records(records(0.5), records(noise), 1, "cpu")
    assert not compare_records(records(0.5), records(noise), 1, "cuda")
    wrong = 0.5 + 10 * GPU_SCALAR_RTOL  # what a resume with the wrong state looks like
    assert "step 2: train_loss" in compare_records(records(0.5), records(wrong), 1, "cuda")[0]

    weights = {"w": torch.linspace(-1, 1, 100)}
    nudged = {"w": weights["w"] * (1 + GPU_WEIGHT_RTOL / 10)}
    assert compare_weights(weights, nudged, "cpu") and not compare_weights(weights, nudged, "cuda")
    assert compare_weights(weights, {"w": weights["w"] * (1 + 10 * GPU_WEIGHT_RTOL)}, "cuda")
    assert not compare_weights(weights, {"w": weights["w"].clone()}, "cpu")


@pytest.mark.slow
def test_smoke_passes_on_a_joint_space_dataset(joint_dataset) -> None:
    store, stats = joint_dataset
    report = run_smoke(store, stats, CONFIG, steps=4)
    assert report.ok, report.problems
    assert report.resumed_at == 2
