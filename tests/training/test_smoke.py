from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from policypipe.atomic import write_folder_atomic
from policypipe.training.smoke import run_smoke
from tests.training.conftest import CONFIG


def test_smoke_passes_on_a_sound_setup(dataset) -> None:
    store, stats = dataset
    report = run_smoke(store, stats, CONFIG, steps=6)
    assert report.ok, report.problems
    assert report.resumed_at == 3 and report.peak_rss_mb > 0


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
