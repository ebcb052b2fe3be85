"""The training loop, written out: accelerate for device, precision, accumulation and
distribution; everything else visible here, top to bottom.

Rank 0 alone writes checkpoints, logs and metrics. A run resumes from `latest` only when its
run-determining config, the dataset fingerprint and the statistics match; otherwise it refuses
and says what differs. Resume is exact: the sampler's position, every RNG and the optimizer,
schedule and EMA are restored, so a run killed and resumed ends with the same weights.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from policypipe.atomic import canonical_json, write_json_atomic
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.config import PolicyConfig
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.checkpoint import (
    CheckpointError,
    TrainingState,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from policypipe.training.data import WindowDataset

log = logging.getLogger(__name__)

LATEST = "latest"


@dataclass(frozen=True)
class TrainConfig:
    """`train` section of params.yaml (model sizes in `train.model`)."""

    seed: int = 0
    steps: int = 2000
    batch_size: int = 64  # per optimizer step, over all processes and accumulation
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 1e-6
    warmup_steps: int = 200
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    mixed_precision: str = "no"  # "no" | "bf16"
    num_workers: int = 2
    val_every: int = 100
    val_batches: int = 4
    checkpoint_every: int = 200
    keep_top_k: int = 2
    num_processes: int = 1
    # Where checkpoints go when data/train cannot be written (disk full, quota); null: nowhere.
    fallback_dir: str | None = None
    # Out of memory in the first steps: halve the per-device batch and double grad_accum (the
    # batch per optimizer step is kept), down to this many samples per device.
    min_device_batch: int = 2
    model: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("steps, batch_size and grad_accum must be >= 1")
        if self.batch_size % (self.grad_accum * self.num_processes):
            raise ValueError(
                f"batch_size {self.batch_size} must be divisible by grad_accum x num_processes "
                f"({self.grad_accum} x {self.num_processes})"
            )
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")

    def run_determining(self) -> dict[str, Any]:
        """What decides the weights a run ends with (not where or how fast it runs), flat and
        in JSON form: {"lr": ..., "model.down_dims": [...], ...}."""
        values = asdict(self)
        # grad_accum splits the same samples into smaller micro-batches (the out-of-memory
        # fallback changes it); a resumed run keeps the accumulation its checkpoint was made with.
        for key in ("num_workers", "fallback_dir", "val_every", "val_batches", "checkpoint_every", "keep_top_k",
                    "grad_accum", "min_device_batch"):
            values.pop(key)
        model = values.pop("model")
        values |= {f"model.{k}": v for k, v in model.items()}
        return json.loads(canonical_json(values))


# ---------------------------------------------------------------- pieces


class EpochSampler:
    """Batches of indices: a fresh seeded permutation per epoch, every batch full.

    Global batch g (one optimizer step) is a pure function of (seed, g), so a run resumes
    exactly from its step count (the DataLoader reads ahead of what the loop consumed, so the
    sampler's own position would not do), whatever the accumulation splits it into.
    """

    def __init__(self, n: int, batch_size: int, seed: int, start_batch: int = 0) -> None:
        if n < batch_size:
            raise ValueError(f"{n} training samples, fewer than one batch of {batch_size}")
        self.n, self.batch_size, self.seed, self.start_batch = n, batch_size, seed, start_batch

    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        g = self.start_batch
        while True:
            epoch, position = divmod(g, self.batches_per_epoch())
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
            start = position * self.batch_size
            yield order[start : start + self.batch_size].tolist()
            g += 1


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float, step: int) -> None:
    # Warm-up of the decay, so early EMA weights are not dominated by the random initialisation.
    d = min(decay, (1 + step) / (10 + step))
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p.detach(), 1 - d)
    for e, b in zip(ema.buffers(), model.buffers()):
        e.copy_(b)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def validation_loss(policy: DiffusionPolicy, batches: list[dict[str, torch.Tensor]], device, seed: int) -> float:
    """Denoising loss on held-out episodes, with fixed noise: comparable across steps and runs."""
    was_training = policy.training
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = [policy.compute_loss(_to(b, device), generator).item() for b in batches]
    policy.train(was_training)
    return float(np.mean(losses))


# ---------------------------------------------------------------- the run


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
        old = recorded.get("config", {})
        for key in sorted(set(old) | set(self.config)):
            if old.get(key) != self.config.get(key):
                found.append(f"train.{key}: {old.get(key)!r} -> {self.config.get(key)!r}")
        return found


@dataclass
class TrainResult:
    steps: int
    resumed_from: int | None
    first_val_loss: float | None
    best_val_loss: float | None
    last_train_loss: float
    samples_per_s: float
    data_wait_fraction: float
    checkpoint_warnings: list[str]
    policy: DiffusionPolicy  # the EMA weights: what is evaluated and exported
    oom_adjustments: list[str] = field(default_factory=list)


# Out-of-memory errors this many steps into a (re)start are met by a smaller micro-batch.
OOM_WINDOW_STEPS = 3


class _EarlyOutOfMemory(Exception):
    pass


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "can't allocate memory" in str(exc))
    )


def train(
    *,
    store: Path,
    stats: dict[str, Any],
    stats_sha256: str,
    config: TrainConfig,
    run_dir: Path,
    log_step: Callable[[dict[str, float]], None] | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    """Trains to `config.steps`, resuming `run_dir` when it holds an unfinished run of this setup.

    Out of memory in the first steps: the per-device batch is halved and the accumulation
    doubled (the batch per optimizer step is kept) down to `min_device_batch`, and the
    adjustment is recorded. `stop_after` ends the run early at that step with `latest` saved,
    as an interruption would (the smoke check uses it).
    """
    adjustments: list[str] = []
    while True:
        try:
            result = _train_once(store=store, stats=stats, stats_sha256=stats_sha256, config=config,
                                 run_dir=run_dir, log_step=log_step, stop_after=stop_after)
            result.oom_adjustments = adjustments
            return result
        except _EarlyOutOfMemory as exc:
            accum = config.grad_accum * 2
            per_device = config.batch_size // (accum * config.num_processes)
            if config.batch_size % (accum * config.num_processes) or per_device < config.min_device_batch:
                raise exc.__cause__ from None
            note = (f"out of memory at {config.batch_size // (config.grad_accum * config.num_processes)} samples per "
                    f"device: retrying with {per_device} and grad_accum {accum}")
            log.warning(note)
            adjustments.append(note)
            config = replace(config, grad_accum=accum)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _train_once(
    *,
    store: Path,
    stats: dict[str, Any],
    stats_sha256: str,
    config: TrainConfig,
    run_dir: Path,
    log_step: Callable[[dict[str, float]], None] | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    from accelerate import Accelerator

    state = _resumable_state(Path(run_dir) / "checkpoints" / LATEST,
                             RunIdentity(config.run_determining(), stats["dataset_fingerprint"]["sha256"], stats_sha256),
                             config.steps)
    if state is not None:  # continue with (at least) the accumulation the run was made with
        config = replace(config, grad_accum=max(config.grad_accum, state.trainer.get("grad_accum", 1)))

    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.grad_accum,
        cpu=not torch.cuda.is_available(),
    )
    is_main = accelerator.is_main_process
    if accelerator.num_processes != config.num_processes:
        raise ValueError(
            f"train.num_processes is {config.num_processes} but {accelerator.num_processes} processes are running"
        )
    per_device_batch = config.batch_size // (config.grad_accum * accelerator.num_processes)
    window = WindowConfig(config.model.n_obs_steps, config.model.horizon, config.model.n_action_steps)
    identity = RunIdentity(config.run_determining(), stats["dataset_fingerprint"]["sha256"], stats_sha256)
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"

    # Seeds first: model initialisation draws from torch's global generator.
    seed = config.seed + accelerator.process_index
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)  # noise, diffusion steps, crops

    policy = DiffusionPolicy(config.model)
    policy.fit_normalizers(stats)
    ema = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config.warmup_steps, config.steps))

    train_set = WindowDataset(store, stats["split"]["train"], window)
    val_set = WindowDataset(store, stats["split"]["val"], window)

    start_step, resumed_from, history = 0, None, _History()
    if state is not None:
        policy.load_state_dict(state.model)
        ema.load_state_dict(state.ema)
        optimizer.load_state_dict(state.optimizer)
        schedule.load_state_dict(state.trainer["lr_schedule"])
        restore_rng(state.trainer["rng"], state.rng_tensors, generator)
        history = _History.from_json(state.trainer["history"])
        start_step = resumed_from = state.trainer["step"]
        log.info("resuming from %s at step %d", checkpoints / LATEST, start_step)
    elif is_main and run_dir.exists():
        shutil.rmtree(run_dir)  # a finished run of another config: it lives on in DVC's cache
    accelerator.wait_for_everyone()
    sampler = EpochSampler(len(train_set), config.batch_size, config.seed, start_step)

    policy, optimizer = accelerator.prepare(policy, optimizer)
    ema.to(accelerator.device)
    loader = DataLoader(
        train_set,
        batch_sampler=_MicroBatches(sampler, accelerator.process_index, accelerator.num_processes, config.grad_accum),
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
    )
    val_batches = _fixed_val_batches(val_set, per_device_batch, config.val_batches)
    warnings: list[str] = []

    batches = iter(loader)
    wait_s = busy_s = 0.0
    samples = 0
    loss_value = float("nan")
    done = start_step
    for step in range(start_step, config.steps):
        t0 = time.perf_counter()
        for _ in range(config.grad_accum):
            t_wait = time.perf_counter()
            batch = _to(next(batches), accelerator.device)
            wait_s += time.perf_counter() - t_wait
            with accelerator.accumulate(policy):
                try:
                    loss = policy(batch, generator)  # through the wrapper: DDP syncs gradients
                    accelerator.backward(loss)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
                    if _is_out_of_memory(exc) and step < start_step + OOM_WINDOW_STEPS:
                        raise _EarlyOutOfMemory() from exc
                    raise
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(policy.parameters(), config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            samples += len(batch["action"]) * accelerator.num_processes
        schedule.step()
        ema_update(ema, accelerator.unwrap_model(policy), config.ema_decay, step)
        loss_value = accelerator.gather(loss.detach()[None]).mean().item()
        busy_s += time.perf_counter() - t0
        done = step + 1

        record = {"step": done, "train_loss": loss_value, "lr": schedule.get_last_lr()[0],
                  "samples_per_s": samples / max(busy_s, 1e-9), "data_wait_fraction": wait_s / max(busy_s, 1e-9)}
        stopping = done == stop_after
        checkpointing = done % config.checkpoint_every == 0 or done == config.steps or stopping
        # Every checkpoint gets a validation loss: the top-k are chosen by it.
        if done % config.val_every == 0 or checkpointing or done == 1:
            record["val_loss"] = validation_loss(ema, val_batches, accelerator.device, config.seed)
            history.val.append((done, record["val_loss"]))
        if is_main and log_step is not None:
            log_step(record)
        if is_main and checkpointing:
            trainer = _trainer_state(identity, done, schedule, history, config.steps) | {"grad_accum": config.grad_accum}
            plain_rng, rng_tensors = capture_rng(generator)
            snapshot = TrainingState(
                model=accelerator.unwrap_model(policy).state_dict(), ema=ema.state_dict(),
                optimizer=optimizer.state_dict(), trainer=trainer | {"rng": plain_rng}, rng_tensors=rng_tensors,
            )
            warnings += _save_all(snapshot, checkpoints, history, config, run_dir)
        accelerator.wait_for_everyone()
        if stopping:
            break

    if is_main:
        write_json_atomic(run_dir / "history.json", history.to_json())
    return TrainResult(
        steps=done, resumed_from=resumed_from,
        first_val_loss=history.val[0][1] if history.val else None,
        best_val_loss=min((v for _, v in history.val), default=None),
        last_train_loss=loss_value, samples_per_s=samples / max(busy_s, 1e-9),
        data_wait_fraction=wait_s / max(busy_s, 1e-9), checkpoint_warnings=warnings, policy=ema,
    )


class _MicroBatches:
    """This process's micro-batches: its share of each global batch, split for accumulation.

    Every rank walks the same sampler sequence. Consecutive micro-batches of a step are
    consecutive slices of one global batch, so halving the micro-batch and doubling the
    accumulation feeds each optimizer step exactly the same samples.
    """

    def __init__(self, sampler: EpochSampler, rank: int, world: int, accum: int) -> None:
        self.sampler, self.rank, self.world, self.accum = sampler, rank, world, accum

    def __iter__(self):
        for batch in self.sampler:
            share = len(batch) // self.world
            mine = batch[self.rank * share : (self.rank + 1) * share]
            micro = share // self.accum
            for k in range(self.accum):
                yield mine[k * micro : (k + 1) * micro]


def _fixed_val_batches(val_set: WindowDataset, batch_size: int, count: int) -> list[dict[str, torch.Tensor]]:
    """Evenly spaced held-out samples, loaded once: the same every time validation runs."""
    n = min(len(val_set), batch_size * count)
    picks = np.linspace(0, len(val_set) - 1, n).round().astype(int)
    items = [val_set[int(i)] for i in picks]
    return [
        {k: torch.stack([it[k] for it in items[s : s + batch_size]]) for k in items[0]}
        for s in range(0, n, batch_size)
    ]


@dataclass
class _History:
    val: list[tuple[int, float]] = field(default_factory=list)
    top_k: list[tuple[float, int, str]] = field(default_factory=list)  # (val loss, step, folder)

    def to_json(self) -> dict[str, Any]:
        return {"val": [list(v) for v in self.val], "top_k": [list(t) for t in self.top_k]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _History:
        return cls([tuple(v) for v in data["val"]], [tuple(t) for t in data["top_k"]])


def _trainer_state(identity, step, schedule, history, total) -> dict[str, Any]:
    return {
        "step": step,
        "complete": step >= total,
        "lr_schedule": schedule.state_dict(),
        "config": identity.config,
        "dataset_fingerprint": identity.dataset_fingerprint,
        "stats_sha256": identity.stats_sha256,
        "history": history.to_json(),
    }


def _resumable_state(latest: Path, identity: RunIdentity, total_steps: int) -> TrainingState | None:
    if not latest.exists():
        return None
    state = load_checkpoint(latest)
    complete = state.trainer.get("complete", False)
    differences = identity.differences(state.trainer)
    if complete:
        # A finished run: start a new one (the old is in DVC's cache); same config would
        # reproduce the same weights anyway.
        return None
    if differences:
        raise CheckpointError(
            f"{latest} is an unfinished run of another setup ({'; '.join(differences)}). "
            f"Resume it with the old params, or start fresh: remove {latest.parent.parent} and rerun."
        )
    return state


def _save_all(snapshot: TrainingState, checkpoints: Path, history: _History, config: TrainConfig, run_dir: Path) -> list[str]:
    """latest, and a top-k slot named for the validation loss; a failed write keeps training going."""
    warnings = []
    targets = [checkpoints / LATEST]
    step = snapshot.trainer["step"]
    current = next((v for s, v in reversed(history.val) if s == step), None)
    if current is not None and config.keep_top_k > 0:
        worst = max(history.top_k)[0] if len(history.top_k) >= config.keep_top_k else math.inf
        if current < worst:
            name = f"val_loss-{current:.5f}-step-{step:07d}"
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
                    message += f"; the fallback {config.fallback_dir} failed too ({fallback_exc.strerror or fallback_exc})"
            log.warning(message)
            warnings.append(message)
    for _, _, name in history.top_k[config.keep_top_k :]:
        shutil.rmtree(checkpoints / name, ignore_errors=True)
    history.top_k = history.top_k[: config.keep_top_k]
    write_json_atomic(run_dir / "history.json", history.to_json())
    return warnings
