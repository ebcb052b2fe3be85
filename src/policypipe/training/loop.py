"""The training loop, written out: accelerate for device, precision, accumulation and
distribution; everything else visible here, top to bottom (`train` and the loop it runs).

Rank 0 alone writes checkpoints, logs and metrics. What resumes from where, and what is
byte-identical, is in docs/training.md ("Checkpoints and resume", "What is byte-identical").
"""

from __future__ import annotations

import copy
import gc
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from policypipe.atomic import write_json_atomic
from policypipe.config import require_same_window
from policypipe.dataset.events import training_labels
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.checkpoint import (
    LATEST,
    RunIdentity,
    TrainHistory,
    TrainingState,
    capture_rng,
    pack_rng,
    restore_rng,
    resume_point,
    save_checkpoints,
    trainer_state,
)
from policypipe.training.config import TrainConfig, model_for_dataset
from policypipe.training.distributed import (
    OOM_WINDOW_STEPS,
    EarlyOutOfMemory,
    any_process,
    backward_agreeing_on_memory,
)
from policypipe.training.pretrain import pretrain_encoder
from policypipe.training.ranking import ExecutedErrorProbe
from policypipe.training.sampler import EpochSampler, MicroBatches, fixed_val_batches
from policypipe.training.schedules import ema_decay, ema_update, lr_factor

log = logging.getLogger(__name__)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def adamw(policy: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """The training's optimizer, on `train.fused_adamw`'s kernel (None: torch's default, a loop on
    the CPU)."""
    return torch.optim.AdamW(
        policy.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=True if config.fused_adamw else None,
    )


@torch.no_grad()
def validation_losses(
    policy: DiffusionPolicy, batches: list[dict[str, torch.Tensor]], device, seed: int
) -> dict[str, float]:
    """Losses on held-out episodes, with fixed noise: comparable across steps and runs. "diffusion":
    the denoising loss, whatever else the policy is trained on; "event": the event loss, when it is."""
    was_training = policy.training
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = [policy.compute_losses(_to(b, device), generator) for b in batches]
    policy.train(was_training)
    return {key: float(np.mean([loss[key].item() for loss in losses])) for key in losses[0]}


@dataclass
class TrainResult:
    steps: int
    resumed_from: int | None
    first_val_loss: float | None
    best_val_loss: float | None
    # The best executed-step error on the fixed validation windows (training/ranking.py), if measured.
    best_executed: dict[str, float] | None
    last_train_loss: float
    samples_per_s: float
    data_wait_fraction: float
    checkpoint_warnings: list[str]
    policy: DiffusionPolicy  # the EMA weights: what is evaluated and exported
    oom_adjustments: list[str] = field(default_factory=list)
    # Stopped early on request (a stop signal): `latest` holds the state, a rerun continues it.
    interrupted: bool = False

    def metrics(self, run_dir: Path, wall_time_s: float) -> dict[str, Any]:
        """What `dvc metrics` shows of the run (the train stage's metrics file)."""
        latest = run_dir / "checkpoints" / LATEST
        return {
            "steps": self.steps,
            "resumed_from_step": self.resumed_from,
            "val_loss_first": self.first_val_loss,
            "val_loss_best": self.best_val_loss,
            "val_executed_best": self.best_executed,
            "train_loss_last": self.last_train_loss,
            "samples_per_s": round(self.samples_per_s, 2),
            "data_wait_fraction": round(self.data_wait_fraction, 4),
            "wall_time_s": round(wall_time_s, 1),
            "checkpoint_bytes": sum(p.stat().st_size for p in latest.iterdir()) if latest.exists() else None,
            "parameters": sum(p.numel() for p in self.policy.parameters()),
            "checkpoint_warnings": self.checkpoint_warnings,
            "oom_adjustments": self.oom_adjustments,
        }


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
    row_features: dict[str, np.ndarray] | None = None,
) -> TrainResult:
    """Trains to `config.steps`, resuming `run_dir` when it holds an unfinished run of this setup.

    `stop_after` ends the run early at that step with `latest` saved, as an interruption would
    (the smoke check uses it); so does `stop_requested()` turning true on any process (Slurm's
    warning signal), at the next step boundary, every process at the same one, and the result
    says `interrupted`. CPU work runs on `config.cpu_threads` threads; the caller's setting is
    restored on return. `row_features` adds per-row observations to every sample (`WindowDataset`):
    the privileged control's scene state, which `stats` must then describe (`obs.scene_state`).
    """
    require_same_window(stats, asdict(config.window), "train.model (the [policy] section)")
    config = replace(config, model=model_for_dataset(config.model, stats))
    adjustments: list[str] = []
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.cpu_threads)
    try:
        while True:
            try:
                result = _train_once(
                    store=store,
                    stats=stats,
                    stats_sha256=stats_sha256,
                    config=config,
                    run_dir=Path(run_dir),
                    log_step=log_step,
                    stop_after=stop_after,
                    stop_requested=stop_requested,
                    row_features=row_features,
                )
                break
            except EarlyOutOfMemory as exc:
                # Out of memory in the first steps, on any process: all retry with half the
                # micro-batch and twice the accumulation (the batch per optimizer step is kept),
                # down to min_device_batch samples per device; then the error is the user's.
                smaller = _halved_micro_batch(config)
                if smaller is None:
                    raise exc.__cause__ from None
                note = (
                    f"out of memory at {_device_batch(config)} samples per device: "
                    f"retrying with {_device_batch(smaller)} and grad_accum {smaller.grad_accum}"
                )
                log.warning(note)
                adjustments.append(note)
                config = smaller
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(previous_threads)
    result.oom_adjustments = adjustments
    return result


def _device_batch(config: TrainConfig) -> int:
    return config.batch_size // (config.grad_accum * config.num_processes)


def _halved_micro_batch(config: TrainConfig) -> TrainConfig | None:
    """The same batch per optimizer step in micro-batches half the size; None below the floor."""
    accum = config.grad_accum * 2
    if config.batch_size % (accum * config.num_processes):
        return None
    smaller = replace(config, grad_accum=accum)
    return smaller if _device_batch(smaller) >= config.min_device_batch else None


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
    row_features: dict[str, np.ndarray] | None = None,
) -> TrainResult:
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    identity = RunIdentity(config.run_determining(), stats["dataset_fingerprint"]["sha256"], stats_sha256)
    resume = resume_point(run_dir, config.fallback_dir, identity)
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
    window = config.window
    checkpoints = run_dir / "checkpoints"

    # Seeds first: model initialisation draws from torch's global generator.
    seed = config.seed + accelerator.process_index
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)  # noise, diffusion steps, crops

    policy = DiffusionPolicy(config.model, channels_last=config.channels_last)
    policy.fit_normalizers(stats)
    ema = copy.deepcopy(policy).requires_grad_(False)
    optimizer = adamw(policy, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, config.steps)
    )

    images = not config.model.privileged
    if config.model.event_labels:  # each row's next grasp and release poses, the event loss's targets
        labels = training_labels(store, stats, stats["split"]["train"] + stats["split"]["val"])
        row_features = {**(row_features or {}), **labels}
    remembers = config.model.remember_release
    train_set = WindowDataset(store, stats["split"]["train"], window, row_features, images, remembers)
    val_set = WindowDataset(store, stats["split"]["val"], window, row_features, images, remembers)

    # Before the loading workers start (and pretraining): they share what is decoded here.
    for note in train_set.keep_decoded_frames(config.frame_cache_mb * 10**6, shared=config.num_workers > 0):
        log.warning(note)

    start_step, resumed_from, history = 0, None, TrainHistory()
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
        history = TrainHistory.from_json(state.trainer["history"])
        start_step = resumed_from = state.trainer["step"]
        log.info("resuming from %s at step %d", resume.folder, start_step)
    elif config.encoder_pretrain_steps:  # a fresh run: the encoder first learns the grasps and releases
        policy.to(accelerator.device)
        losses = pretrain_encoder(
            policy,
            train_set,
            config.encoder_pretrain_steps,
            _device_batch(config),
            config.lr,
            config.seed,
            accelerator.device,
        )
        ema.load_state_dict(policy.state_dict())  # the EMA starts from the pretrained weights too
        log.info("encoder pretrained: event loss %.4f -> %.4f", losses[0], losses[-1])
    if config.freeze_encoder:  # it stays as pretrained (the checkpoint of a resumed run holds it)
        for encoder in policy.event_encoders():
            encoder.requires_grad_(False)
    if is_main and resume.replace_run_dir and run_dir.exists():
        shutil.rmtree(run_dir)  # only what resume_point allows: see there
    accelerator.wait_for_everyone()
    sampler = EpochSampler(len(train_set), config.batch_size, config.seed, start_step)

    policy, optimizer = accelerator.prepare(policy, optimizer)
    ema.to(accelerator.device)
    loader = DataLoader(
        train_set,
        batch_sampler=MicroBatches(
            sampler, accelerator.process_index, accelerator.num_processes, config.grad_accum
        ),
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
    )
    val_batches = fixed_val_batches(val_set, _device_batch(config), config.val_batches)
    # Rank 0 alone ranks and writes checkpoints, so it alone measures the executed error.
    probe = (
        ExecutedErrorProbe.of(val_set, config.rank_samples, window.n_action_steps, config.seed)
        if is_main
        else None
    )
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
                    loss = backward_agreeing_on_memory(accelerator, policy, batch, generator)
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
            interrupted = any_process(accelerator, stop_requested())
        stopping = done == stop_after or interrupted
        scheduled = done % config.checkpoint_every == 0 or done == config.steps
        checkpointing = scheduled or stopping
        # Every scheduled checkpoint gets a validation loss and an executed-step error: the top-k
        # are chosen by one of them (train.rank_by). An interruption's checkpoint is only `latest`,
        # to continue from: no validation there, so an interrupted and resumed run keeps the
        # history (and top-k) of an uninterrupted one.
        if done % config.val_every == 0 or scheduled or done == 1:
            val = validation_losses(ema, val_batches, accelerator.device, config.seed)
            record["val_loss"] = val["diffusion"]
            if "event" in val:
                record["val_event_loss"] = val["event"]
            history.val.append((done, record["val_loss"]))
        if scheduled and probe is not None:
            executed = probe.measure(ema, accelerator.device)
            history.executed.append((done, executed))
            record |= {f"val_executed_{key}": value for key, value in executed.items()}
        if is_main and log_step is not None:
            log_step(record)
        if checkpointing:
            # Every process's own RNG states (each draws its own noise and crops), collected on all.
            rng_by_rank = gather_object([capture_rng(generator)])
        if is_main and checkpointing:
            trainer = trainer_state(identity, done, schedule, history, config.steps) | {
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
            warnings += save_checkpoints(snapshot, checkpoints, history, config, run_dir, ranked=scheduled)
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
        best_executed=min((e for _, e in history.executed), key=lambda e: e["score"], default=None),
        last_train_loss=loss_value,
        samples_per_s=samples / max(busy_s, 1e-9),
        data_wait_fraction=wait_s / max(busy_s, 1e-9),
        checkpoint_warnings=warnings,
        policy=ema,
        interrupted=interrupted,
    )
