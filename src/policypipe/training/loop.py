"""The training loop, written out: accelerate for device, precision, accumulation and
distribution; everything else visible here, top to bottom.

Rank 0 alone writes checkpoints, logs and metrics. A run resumes from the newest of `latest`
and the fallback folder's checkpoints whose run-determining config, dataset fingerprint and
statistics match; an unfinished `latest` of another setup is refused, saying what differs.
Resume is exact: the sampler's position, every RNG of every process (each rank its own) and
the optimizer, schedule and EMA are restored, so a run killed and resumed ends with the same
weights. On CPU the weights are a function of the inputs, the params and `cpu_threads` (not of
`num_workers` or machine load), on the same CPU type and torch build; GPU kernels are not
bitwise reproducible.
"""

from __future__ import annotations

import copy
import gc
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
import torch.distributed as dist
from torch.utils.data import DataLoader

from policypipe.atomic import MANIFEST, verify_folder, write_json_atomic
from policypipe.config import require_same_window
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.checkpoint import (
    CheckpointError,
    TrainingState,
    capture_rng,
    load_checkpoint,
    pack_rng,
    read_trainer,
    restore_rng,
    save_checkpoint,
)
from policypipe.training.config import TrainConfig

log = logging.getLogger(__name__)

LATEST = "latest"


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
            order = torch.randperm(
                self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            )
            start = position * self.batch_size
            yield order[start : start + self.batch_size].tolist()
            g += 1


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def ema_decay(step: int, config: TrainConfig) -> float:
    """The EMA decay of the update after optimizer step `step` (0-based): diffusion_policy's
    `EMAModel.get_decay(step)` (Chi et al.; update_after_step 0). Small early, so the EMA is not
    dominated by the random initialisation; the first two updates copy the weights."""
    s = max(0, step - 1)
    if s == 0:
        return 0.0
    value = 1 - (1 + s / config.ema_inv_gamma) ** -config.ema_power
    return max(config.ema_min_decay, min(value, config.ema_max_decay))


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p.detach(), 1 - decay)
    for e, b in zip(ema.buffers(), model.buffers()):
        e.copy_(b)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def validation_loss(
    policy: DiffusionPolicy, batches: list[dict[str, torch.Tensor]], device, seed: int
) -> float:
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
    # Stopped early on request (a stop signal): `latest` holds the state, a rerun continues it.
    interrupted: bool = False


# Out-of-memory errors this many steps into a (re)start are met by a smaller micro-batch, on
# every process at once (see _backward_agreeing_on_memory).
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
    stop_requested: Callable[[], bool] | None = None,
) -> TrainResult:
    """Trains to `config.steps`, resuming `run_dir` when it holds an unfinished run of this setup.

    Out of memory in the first steps: the per-device batch is halved and the accumulation
    doubled (the batch per optimizer step is kept) down to `min_device_batch`, and the
    adjustment is recorded. `stop_after` ends the run early at that step with `latest` saved,
    as an interruption would (the smoke check uses it); so does `stop_requested()` turning true
    on any process (Slurm's warning signal), at the next step boundary, every process at the
    same one, and the result says `interrupted`. CPU work runs on `config.cpu_threads`
    threads; the process's own setting is restored on return.
    """
    require_same_window(stats, asdict(config.window), "train.model (the [policy] section)")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.cpu_threads)
    try:
        return _train_backing_off(
            store=store,
            stats=stats,
            stats_sha256=stats_sha256,
            config=config,
            run_dir=run_dir,
            log_step=log_step,
            stop_after=stop_after,
            stop_requested=stop_requested,
        )
    finally:
        torch.set_num_threads(previous_threads)  # the caller's process setting, as it was


def _train_backing_off(*, config: TrainConfig, **run) -> TrainResult:
    adjustments: list[str] = []
    while True:
        try:
            result = _train_once(config=config, **run)
            result.oom_adjustments = adjustments
            return result
        except _EarlyOutOfMemory as exc:
            accum = config.grad_accum * 2
            per_device = config.batch_size // (accum * config.num_processes)
            if config.batch_size % (accum * config.num_processes) or per_device < config.min_device_batch:
                raise exc.__cause__ from None
            note = (
                "out of memory at "
                f"{config.batch_size // (config.grad_accum * config.num_processes)} samples per "
                f"device: retrying with {per_device} and grad_accum {accum}"
            )
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
    stop_requested: Callable[[], bool] | None = None,
) -> TrainResult:
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    resume = _resume_point(
        Path(run_dir),
        config.fallback_dir,
        RunIdentity(config.run_determining(), stats["dataset_fingerprint"]["sha256"], stats_sha256),
    )
    state = resume.state
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
            f"train.num_processes is {config.num_processes} but "
            f"{accelerator.num_processes} processes are running"
        )
    per_device_batch = config.batch_size // (config.grad_accum * accelerator.num_processes)
    window = config.window
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
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, config.steps)
    )

    train_set = WindowDataset(store, stats["split"]["train"], window)
    val_set = WindowDataset(store, stats["split"]["val"], window)

    start_step, resumed_from, history = 0, None, _History()
    if state is not None:
        policy.load_state_dict(state.model)
        ema.load_state_dict(state.ema)
        optimizer.load_state_dict(state.optimizer)
        schedule.load_state_dict(state.trainer["lr_schedule"])
        restore_rng(
            state.trainer["rng"],
            state.rng_tensors,
            generator,
            accelerator.process_index,
            accelerator.num_processes,
        )
        history = _History.from_json(state.trainer["history"])
        start_step = resumed_from = state.trainer["step"]
        log.info("resuming from %s at step %d", resume.folder, start_step)
    if is_main and resume.replace_run_dir and run_dir.exists():
        shutil.rmtree(run_dir)  # only what _resume_point allows: see there
    accelerator.wait_for_everyone()
    sampler = EpochSampler(len(train_set), config.batch_size, config.seed, start_step)

    policy, optimizer = accelerator.prepare(policy, optimizer)
    ema.to(accelerator.device)
    loader = DataLoader(
        train_set,
        batch_sampler=_MicroBatches(
            sampler, accelerator.process_index, accelerator.num_processes, config.grad_accum
        ),
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
    interrupted = False
    for step in range(start_step, config.steps):
        t0 = time.perf_counter()
        for _ in range(config.grad_accum):
            t_wait = time.perf_counter()
            batch = _to(next(batches), accelerator.device)
            wait_s += time.perf_counter() - t_wait
            with accelerator.accumulate(policy):
                if step < start_step + OOM_WINDOW_STEPS:
                    loss = _backward_agreeing_on_memory(accelerator, policy, batch, generator)
                else:
                    loss = policy(batch, generator)  # through the wrapper: DDP syncs gradients
                    accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(policy.parameters(), config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            samples += len(batch["action"]) * accelerator.num_processes
        schedule.step()
        ema_update(ema, accelerator.unwrap_model(policy), ema_decay(step, config))
        loss_value = accelerator.gather(loss.detach()[None]).mean().item()
        busy_s += time.perf_counter() - t0
        done = step + 1

        record = {
            "step": done,
            "train_loss": loss_value,
            "lr": schedule.get_last_lr()[0],
            "samples_per_s": samples / max(busy_s, 1e-9),
            "data_wait_fraction": wait_s / max(busy_s, 1e-9),
        }
        if stop_requested is not None and done < config.steps:
            interrupted = _any_process(accelerator, stop_requested())
        stopping = done == stop_after or interrupted
        scheduled = done % config.checkpoint_every == 0 or done == config.steps
        checkpointing = scheduled or stopping
        # Every scheduled checkpoint gets a validation loss: the top-k are chosen by it. An
        # interruption's checkpoint is only `latest`, to continue from: no validation there, so
        # an interrupted and resumed run keeps the history (and top-k) of an uninterrupted one.
        if done % config.val_every == 0 or scheduled or done == 1:
            record["val_loss"] = validation_loss(ema, val_batches, accelerator.device, config.seed)
            history.val.append((done, record["val_loss"]))
        if is_main and log_step is not None:
            log_step(record)
        if checkpointing:
            # Every process's own RNG states (each draws its own noise and crops), collected on all.
            rng_by_rank = gather_object([capture_rng(generator)])
        if is_main and checkpointing:
            trainer = _trainer_state(identity, done, schedule, history, config.steps) | {
                "grad_accum": config.grad_accum
            }
            plain_rng, rng_tensors = pack_rng(rng_by_rank)
            snapshot = TrainingState(
                model=accelerator.unwrap_model(policy).state_dict(),
                ema=ema.state_dict(),
                optimizer=optimizer.state_dict(),
                trainer=trainer | {"rng": plain_rng},
                rng_tensors=rng_tensors,
            )
            warnings += _save_all(snapshot, checkpoints, history, config, run_dir, ranked=scheduled)
        accelerator.wait_for_everyone()
        if stopping:
            break

    if is_main:
        write_json_atomic(run_dir / "history.json", history.to_json())
    return TrainResult(
        steps=done,
        resumed_from=resumed_from,
        first_val_loss=history.val[0][1] if history.val else None,
        best_val_loss=min((v for _, v in history.val), default=None),
        last_train_loss=loss_value,
        samples_per_s=samples / max(busy_s, 1e-9),
        data_wait_fraction=wait_s / max(busy_s, 1e-9),
        checkpoint_warnings=warnings,
        policy=ema,
        interrupted=interrupted,
    )


def _any_process(accelerator, flag: bool) -> bool:
    """True on every process if `flag` is true on any (a signal reaches each at its own time)."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor([float(flag)], device=accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _backward_agreeing_on_memory(
    accelerator, policy, batch: dict[str, torch.Tensor], generator: torch.Generator
) -> torch.Tensor:
    """Forward and backward of one micro-batch in the first steps of a (re)start, where running
    out of memory means backing off: all processes back off together, or none does.

    A process out of memory never reaches DDP's gradient all-reduce inside backward, and the
    others would wait for it there forever. So here gradients stay local (no_sync), the processes
    agree whether any ran out, and only then are the gradients averaged as DDP does (each divided
    by the number of processes, then summed: the same bits as DDP's for 2 processes).
    """
    ran_out = None
    try:
        with accelerator.no_sync(policy):
            loss = policy(batch, generator)
            accelerator.backward(loss)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        if not _is_out_of_memory(exc):
            raise
        ran_out = exc
    world = accelerator.num_processes
    if world > 1:
        flags = torch.zeros(world, device=accelerator.device)
        flags[accelerator.process_index] = float(ran_out is not None)
        dist.all_reduce(flags)
        if ran_out is None and flags.any():
            ranks = ", ".join(str(r) for r in flags.nonzero().flatten().tolist())
            ran_out = RuntimeError(f"process {ranks} ran out of memory")
    if ran_out is not None:
        raise _EarlyOutOfMemory() from ran_out
    if accelerator.sync_gradients and world > 1:
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.div_(world)
                dist.all_reduce(p.grad)
    return loss


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


@dataclass(frozen=True)
class _ResumePoint:
    state: TrainingState | None  # None: a fresh run
    folder: Path | None  # where the state was read
    replace_run_dir: bool  # the run folder holds nothing this run may keep (a finished run, logs)


def _resume_point(run_dir: Path, fallback_dir: str | None, identity: RunIdentity) -> _ResumePoint:
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
            return _ResumePoint(state, folder, replace_run_dir=finished_here and folder != latest)
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
    return _ResumePoint(None, None, replace_run_dir=True)


def _save_all(
    snapshot: TrainingState,
    checkpoints: Path,
    history: _History,
    config: TrainConfig,
    run_dir: Path,
    ranked: bool = True,
) -> list[str]:
    """latest, and (if `ranked`) a top-k slot named for the validation loss; a failed write keeps
    training going."""
    warnings = []
    targets = [checkpoints / LATEST]
    step = snapshot.trainer["step"]
    current = next((v for s, v in reversed(history.val) if s == step), None) if ranked else None
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
