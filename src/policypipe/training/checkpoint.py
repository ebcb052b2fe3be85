"""Checkpoints you can trust: complete, atomic, verifiable, and free of pickled code.

A checkpoint is a folder:

  model.safetensors      the policy's weights and normalizer
  ema.safetensors        the EMA weights (what gets evaluated and exported)
  optimizer.safetensors  the optimizer's tensors; its other state is in trainer.json
  rng.safetensors        per process (rank r: "rank{r}.<name>"), torch's CPU and CUDA generator
                         states and the training generator's
  trainer.json           step, epoch, sampler position, LR schedule, every process's Python and
                         NumPy RNG states ("rng", a list by rank), the config, the dataset
                         fingerprint and the statistics' hash
  manifest.json          SHA-256 of every other file

It is written under a temporary name, every file fsynced, then renamed into place; a folder
that is replaced is first renamed aside and removed only after. Loading checks the manifest
first and uses safetensors and JSON only: nothing executes pickled code.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from policypipe.atomic import canonical_json, verify_folder, write_folder_atomic


class CheckpointError(Exception):
    pass


@dataclass
class TrainingState:
    """Everything that determines the rest of a run, as plain data."""

    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor]
    optimizer: dict[str, Any]  # torch optimizer state_dict
    trainer: dict[str, Any]  # JSON-able: step, sampler, schedule, RNG, config, fingerprints
    rng_tensors: dict[str, torch.Tensor]


def capture_rng(generator: torch.Generator) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """This process's RNG states: (JSON-able Python and NumPy states, tensors of torch's states)."""
    py = random.getstate()
    np_state = np.random.get_state()
    tensors = {"torch_cpu": torch.get_rng_state(), "train_generator": generator.get_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = state
    plain = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return plain, tensors


def pack_rng(
    by_rank: list[tuple[dict[str, Any], dict[str, torch.Tensor]]],
) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Every process's `capture_rng` (list index: rank) as the checkpoint holds them: trainer.json's
    "rng" list and rng.safetensors' tensors named "rank{r}.<name>"."""
    plain = [p for p, _ in by_rank]
    tensors = {
        f"rank{rank}.{name}": t for rank, (_, named) in enumerate(by_rank) for name, t in named.items()
    }
    return plain, tensors


def restore_rng(
    plain: list[dict[str, Any]],
    tensors: dict[str, torch.Tensor],
    generator: torch.Generator,
    rank: int,
    world: int,
) -> None:
    """Restores process `rank`'s own states (ranks draw different noise and crops)."""
    if len(plain) != world:
        raise CheckpointError(
            f"the checkpoint holds the RNG states of {len(plain)} processes, {world} are running"
        )
    version, state, gauss = plain[rank]["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = plain[rank]["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    prefix = f"rank{rank}."
    mine = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    torch.set_rng_state(mine["torch_cpu"])
    generator.set_state(mine["train_generator"])
    cuda = [mine[f"torch_cuda_{i}"] for i in range(sum(k.startswith("torch_cuda_") for k in mine))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _optimizer_to_files(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, plain = {}, {"param_groups": state["param_groups"], "state": {}}
    for idx, per_param in state["state"].items():
        plain["state"][str(idx)] = {}
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{name}"] = value.contiguous()
            else:
                plain["state"][str(idx)][name] = value
    return tensors, plain


def _optimizer_from_files(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(k): dict(v) for k, v in plain["state"].items()}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    return {"state": state, "param_groups": plain["param_groups"]}


def save_checkpoint(folder: Path, state: TrainingState) -> Path:
    """Writes the checkpoint atomically at `folder`, replacing an older one only once complete."""
    optimizer_tensors, optimizer_plain = _optimizer_to_files(state.optimizer)
    trainer = canonical_json(state.trainer | {"optimizer": optimizer_plain})
    return write_folder_atomic(
        folder,
        {
            "model.safetensors": lambda p: save_file(_contiguous(state.model), p),
            "ema.safetensors": lambda p: save_file(_contiguous(state.ema), p),
            "optimizer.safetensors": lambda p: save_file(optimizer_tensors, p),
            "rng.safetensors": lambda p: save_file(_contiguous(state.rng_tensors), p),
            "trainer.json": lambda p: p.write_bytes(trainer),
        },
    )


def read_trainer(folder: Path) -> dict[str, Any] | None:
    """A checkpoint's trainer.json (its step, config and fingerprints) without loading the
    tensors or checking the manifest; None if there is none or it cannot be read. For choosing
    between checkpoints: the one chosen is then loaded, and checked, with `load_checkpoint`."""
    try:
        trainer = json.loads((Path(folder) / "trainer.json").read_text())
    except (OSError, ValueError):
        return None
    return trainer if isinstance(trainer, dict) and isinstance(trainer.get("step"), int) else None


def load_checkpoint(folder: Path) -> TrainingState:
    problems = verify_folder(folder)
    if problems:
        raise CheckpointError(f"checkpoint {folder} is damaged: {'; '.join(problems)}")
    trainer = json.loads((Path(folder) / "trainer.json").read_text())
    optimizer = _optimizer_from_files(
        load_file(Path(folder) / "optimizer.safetensors"), trainer.pop("optimizer")
    )
    return TrainingState(
        model=load_file(Path(folder) / "model.safetensors"),
        ema=load_file(Path(folder) / "ema.safetensors"),
        optimizer=optimizer,
        trainer=trainer,
        rng_tensors=load_file(Path(folder) / "rng.safetensors"),
    )


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
