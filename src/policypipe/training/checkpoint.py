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

A run's folder holds `checkpoints/latest` and the top-k by `train.rank_by`; `resume_point`
decides what a run continues from, `save_checkpoints` writes latest and the top-k slots.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from policypipe.atomic import MANIFEST, canonical_json, verify_folder, write_folder_atomic, write_json_atomic
from policypipe.training.config import TrainConfig

log = logging.getLogger(__name__)


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


# ---------------------------------------------------------------- a run's folder: resume and top-k


LATEST = "latest"


# ---------------------------------------------------------------- the run


# What a run recorded before these keys were in a run's identity was computed with: such a run
# resumes with them set so, and is refused, naming them, with other values. The code path's keys
# (the earlier code path, docs/training.md "Throughput"), the event loss and pretraining (none), the
# stem's max-pool (always there before), the event head's cameras (camera 0's), its reader (none)
# its labels' weighting (every label alike) and the diffusion head's memory (none).
EARLIER_CODE_PATH = {"channels_last": False, "fused_adamw": False}
RECORDED_BEFORE_KEYS = EARLIER_CODE_PATH | {
    "model.event_loss_weight": 0.0,
    "model.encoder_stem_pool": True,
    "model.events_from_every_camera": False,
    "model.condition_on_events": False,
    "model.event_loss_near_m": 0.0,
    "model.remember_release": False,
    "encoder_pretrain_steps": 0,
    "freeze_encoder": False,
}


@dataclass(frozen=True)
class RunIdentity:
    config: dict[str, Any]
    dataset_fingerprint: str
    stats_sha256: str

    def differences(self, recorded: dict[str, Any]) -> list[str]:
        found = []
        if recorded.get("dataset_fingerprint") != self.dataset_fingerprint:
            found.append("the dataset (fingerprint) changed")
        if recorded.get("stats_sha256") != self.stats_sha256:
            found.append("the normalization statistics changed")
        old = RECORDED_BEFORE_KEYS | recorded.get("config", {})
        for key in sorted(set(old) | set(self.config)):
            if old.get(key) != self.config.get(key):
                found.append(f"train.{key}: {old.get(key)!r} -> {self.config.get(key)!r}")
        return found


@dataclass
class TrainHistory:
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    # (step, {component: executed error, "score": ...}) at every ranked checkpoint (training/ranking.py)
    executed: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    top_k: list[tuple[float, int, str]] = field(default_factory=list)  # (rank_by's value, step, folder)
    rank_by: str = "val_loss"  # what top_k's values are

    def value(self, rank_by: str, step: int) -> float | None:
        """The ranking value of `step` by `rank_by` (lower is better); None where not measured."""
        if rank_by == "val_loss":
            return next((v for s, v in reversed(self.val) if s == step), None)
        return next((e["score"] for s, e in reversed(self.executed) if s == step), None)

    def rerank(self, rank_by: str) -> None:
        """Re-ranks the kept checkpoints by `rank_by` (a run resumed with another train.rank_by):
        both values are recorded at every ranked checkpoint; one without the new value goes last."""
        if rank_by == self.rank_by:
            return
        rescored = [(self.value(rank_by, step), step, name) for _, step, name in self.top_k]
        self.top_k = sorted((math.inf if v is None else v, step, name) for v, step, name in rescored)
        self.rank_by = rank_by

    def to_json(self) -> dict[str, Any]:
        return {
            "val": [list(v) for v in self.val],
            "executed": [[step, errors] for step, errors in self.executed],
            "top_k": [list(t) for t in self.top_k],
            "rank_by": self.rank_by,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainHistory:
        # Runs from before the executed error was recorded ranked by validation loss.
        return cls(
            [tuple(v) for v in data["val"]],
            [(step, errors) for step, errors in data.get("executed", [])],
            [tuple(t) for t in data["top_k"]],
            data.get("rank_by", "val_loss"),
        )


def trainer_state(identity, step, schedule, history, total) -> dict[str, Any]:
    return {
        "step": step,
        "complete": step >= total,
        "lr_schedule": schedule.state_dict(),
        "config": identity.config,
        "dataset_fingerprint": identity.dataset_fingerprint,
        "stats_sha256": identity.stats_sha256,
        "history": history.to_json(),
    }


@dataclass(frozen=True)
class ResumePoint:
    state: TrainingState | None  # None: a fresh run
    folder: Path | None  # where the state was read
    replace_run_dir: bool  # the run folder holds nothing this run may keep (a finished run, logs)


def resume_point(run_dir: Path, fallback_dir: str | None, identity: RunIdentity) -> ResumePoint:
    """Where this run continues from: the newest intact, unfinished checkpoint of this setup.

    Candidates are the run folder's `latest` and every checkpoint in `fallback_dir`, where
    checkpoints went while the run folder could not be written (a disk full): ignoring them
    would lose the steps trained since. Each resumes exactly; the newest by step saves the most.
    A fallback checkpoint of another setup (the folder may serve several runs) is passed over;
    the run folder's own unfinished `latest` of another setup is refused, as it always was.

    Nothing in the run folder is deleted unless that is safe: a finished run there (the stage
    completed, so DVC has it in its cache) is replaced by a new one, as is an older state of this
    setup when a newer finished one exists elsewhere, and logs without any checkpoint.
    Checkpoints without a readable `latest` (deleted by hand, lost in a copy) are not guessed
    about: they may be the only copy of a run, and a fresh start that kept them beside its own
    would mix two runs in one folder. The run is refused, saying what to move or delete.
    """
    checkpoints = run_dir / "checkpoints"
    latest = checkpoints / LATEST
    candidates: list[
        tuple[int, bool, Path, dict[str, Any]]
    ] = []  # (step, in the run folder, folder, trainer.json)
    finished_here = False
    trainer = read_trainer(latest) if latest.exists() else None
    if trainer is not None:
        differences = identity.differences(trainer)
        finished_here = bool(trainer.get("complete"))
        if differences and not finished_here:
            raise CheckpointError(
                f"{latest} is an unfinished run of another setup ({'; '.join(differences)}). "
                f"Resume it with the old params, or start fresh: remove {run_dir} and rerun."
            )
        if not differences:
            candidates.append((trainer["step"], True, latest, trainer))
    if fallback_dir is not None and Path(fallback_dir).is_dir():
        for folder in sorted(Path(fallback_dir).iterdir()):
            other = read_trainer(folder) if not folder.name.startswith(".") else None
            if other is None:
                continue
            if differences := identity.differences(other):
                log.info(
                    "not resuming from %s, a checkpoint of another setup: %s", folder, "; ".join(differences)
                )
                continue
            candidates.append((other["step"], False, folder, other))

    problems: dict[Path, CheckpointError] = {}
    newest_finished = False
    for _, _, folder, _ in sorted(candidates, key=lambda c: c[:2], reverse=True):
        try:
            state = load_checkpoint(folder)  # the manifest decides: intact or not
        except CheckpointError as exc:
            log.warning("not resuming from %s: %s", folder, exc)
            problems[folder] = exc
            continue
        if not state.trainer.get("complete"):
            # A finished run of another setup in the run folder is replaced, as on a fresh start.
            return ResumePoint(state, folder, replace_run_dir=finished_here and folder != latest)
        # The newest state of this setup is a finished run: start over, as before (a rerun with
        # the same config reproduces the same weights); the run folder's own is older.
        newest_finished = True
        break

    fresh = f"nothing was deleted. To start a fresh run, move {run_dir} aside (or remove it) and rerun."
    if latest in problems and not newest_finished:  # damaged, and nothing intact to continue from
        raise CheckpointError(f"{problems[latest]}; {fresh}") from problems[latest]
    if trainer is None:
        # No readable `latest`: whatever the run folder holds is of a run nobody can name.
        if latest.exists():
            damage = verify_folder(latest) or ["trainer.json: unreadable"]
            raise CheckpointError(f"checkpoint {latest} is damaged: {'; '.join(damage)}; {fresh}")
        kept = (
            sorted(p.name for p in checkpoints.iterdir() if (p / MANIFEST).is_file())
            if checkpoints.is_dir()
            else []
        )
        if kept:
            raise CheckpointError(
                f"{checkpoints} holds {len(kept)} checkpoint(s) ({', '.join(kept)}) "
                "but no `latest` to resume from; "
                f"{fresh} To continue from one of them instead, copy it to {latest}."
            )
    return ResumePoint(None, None, replace_run_dir=True)


def best_ranked_ema(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The best-ranked kept checkpoint's EMA weights (`history.json`'s top_k first, by its rank_by),
    and what the policy's manifest records of it."""
    history_path = Path(run_dir) / "history.json"
    try:
        history = TrainHistory.from_json(json.loads(history_path.read_text()))
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{history_path}: cannot read the ranking ({exc})") from None
    if not history.top_k:
        raise CheckpointError(
            f"{history_path}: no checkpoint was ranked (no {history.rank_by} measured yet); "
            "train longer than checkpoint_every, or export the last step (train.export: last)"
        )
    value, step, name = history.top_k[0]
    ema = load_checkpoint(Path(run_dir) / "checkpoints" / name).ema
    return ema, {"export": "best", "export_step": step, "rank_by": history.rank_by, "rank_value": value}


def save_checkpoints(
    snapshot: TrainingState,
    checkpoints: Path,
    history: TrainHistory,
    config: TrainConfig,
    run_dir: Path,
    ranked: bool = True,
) -> list[str]:
    """latest, and (if `ranked`) a top-k slot named for its `train.rank_by` value; a failed write
    keeps training going."""
    warnings = []
    targets = [checkpoints / LATEST]
    step = snapshot.trainer["step"]
    history.rerank(config.rank_by)
    current = history.value(config.rank_by, step) if ranked else None
    if current is not None and config.keep_top_k > 0:
        worst = max(history.top_k)[0] if len(history.top_k) >= config.keep_top_k else math.inf
        if current < worst:
            name = f"{config.rank_by}-{current:.5f}-step-{step:07d}"
            targets.append(checkpoints / name)
            history.top_k.append((current, step, name))
            history.top_k.sort()
    snapshot.trainer["history"] = history.to_json()
    for target in targets:
        try:
            save_checkpoint(target, snapshot)
        except OSError as exc:
            message = f"checkpoint {target} not written ({exc.strerror or exc}); the previous one stays"
            if config.fallback_dir:
                try:
                    save_checkpoint(Path(config.fallback_dir) / target.name, snapshot)
                    message += f"; written to the fallback {config.fallback_dir}"
                except OSError as fallback_exc:
                    message += (
                        f"; the fallback {config.fallback_dir} failed too "
                        f"({fallback_exc.strerror or fallback_exc})"
                    )
            log.warning(message)
            warnings.append(message)
    for _, _, name in history.top_k[config.keep_top_k :]:
        shutil.rmtree(checkpoints / name, ignore_errors=True)
    history.top_k = history.top_k[: config.keep_top_k]
    write_json_atomic(run_dir / "history.json", history.to_json())
    return warnings
