"""Training benchmark (`make bench`): samples/s of the demo config on this machine's CPU, on the
earlier code path and on params.yaml's, trained in turn in one run, each with where a step's time
goes; on a machine with a GPU, the demo config there (as training takes it) once.

`--gpu` (`make bench-gpu`) trains the real-robot recipe (`REAL_ROBOT`, docs/training.md, "The
real-robot recipe") for a fixed number of steps on one GPU and prints samples/s, peak GPU memory
and the loss; on a machine without CUDA it refuses in one line before any work."""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml
import zarr
from torch.nn.utils import clip_grad_norm_
from torch.utils.data import default_collate

from policypipe.atomic import write_json_atomic
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.training.checkpoint import EARLIER_CODE_PATH
from policypipe.training.config import TrainConfig, model_for_dataset, train_config_from_params
from policypipe.training.loop import adamw, train
from policypipe.training.schedules import ema_update

REPO = Path(__file__).resolve().parents[2]

# The code path before the throughput work (docs/training.md, "Throughput"): training's crops channel
# first, AdamW's loop (what a run recorded before those keys computed with), every frame decoded by
# each sample. The same bytes as that code (tested).
EARLIER_PATH = EARLIER_CODE_PATH | {"frame_cache_mb": 0}

# Pretraining steps the benchmark keeps of the recipe's (`encoder_pretrain_steps`).
PRETRAIN_STEPS = 5

# The real-robot recipe: the real-robot model size (PolicyConfig's defaults: ResNet-18 widths
# 64-512, U-Net 256-512-1024), 224x224 frames cropped to 216, batch 64 in bf16, 8 loading workers,
# and the demo's grasp and release labels (its encoder pretrained on them and frozen, as
# params.yaml's train section says). params.yaml's train section with these replacing its own
# (train.model replaced whole).
REAL_ROBOT = {
    "batch_size": 64,
    "mixed_precision": "bf16",
    "num_workers": 8,
    "model": {
        "image_size": [224, 224],
        "crop_size": [216, 216],
        "event_loss_weight": 1.0,
        "event_loss_near_m": 0.05,
    },
}


def require_cuda() -> None:
    """One line and exit status 2 on a machine where torch sees no CUDA device."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise SystemExit(
            f"bench_train --gpu: no CUDA device here (torch {torch.__version__}, {build}); run it on a "
            "machine with an NVIDIA GPU and a CUDA build of torch"
        )


def build_dataset(
    tmp: Path, recordings: int, image_size: tuple[int, int], window: WindowConfig
) -> tuple[Path, Path]:
    export = write_sample_export(tmp / "raw", SampleConfig(recordings=recordings, seed=2, defects=False)).root
    write_json_atomic(tmp / "manifest.json", pair_export(export, PairConfig()).manifest())
    convert_dataset(
        tmp / "manifest.json", export, tmp / "ds.zarr", tmp / "cache", ConvertConfig(image_size=image_size)
    )
    root = zarr.open_group(tmp / "ds.zarr", mode="r")
    stats = compute_statistics(root, window, StatsConfig())
    stats["dataset_fingerprint"] = {"sha256": fingerprint(root).digest}
    write_json_atomic(tmp / "stats.json", stats)
    return tmp / "ds.zarr", tmp / "stats.json"


def timed(what, repeats: int) -> float:
    """Seconds per call of `what()`, after one call to warm up."""
    what()
    t0 = time.perf_counter()
    for _ in range(repeats):
        what()
    return (time.perf_counter() - t0) / repeats


def step_breakdown(
    store: Path, stats: dict, config: TrainConfig, repeats: int = 10
) -> list[tuple[str, float]]:
    """Where a training step's time goes on `config`'s path: (part, ms per step), each part timed
    alone in this process on `config.cpu_threads` threads, on one fixed batch of training samples.
    In training the data parts run in the loader's workers, beside the model's (`num_workers`)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(config.cpu_threads)
    try:
        config = replace(config, model=model_for_dataset(config.model, stats))
        data = WindowDataset(store, stats["split"]["train"], config.window)
        if config.frame_cache_mb:
            data.keep_decoded_frames(config.frame_cache_mb * 10**6, shared=False)
        picked = np.random.default_rng(0).integers(len(data), size=config.batch_size).tolist()
        items = data.__getitems__(picked)
        parts = [
            (
                "data: windows (interpolated poses, widths, actions)",
                timed(lambda: data.streams.windows(data.anchors[picked], config.window), repeats),
            ),
            (
                "data: a batch of samples (windows, frames, tensors)",
                timed(lambda: data.__getitems__(picked), repeats),
            ),
            ("data: collation", timed(lambda: default_collate(items), repeats)),
        ]
        batch = default_collate(items)
        torch.manual_seed(0)
        policy = DiffusionPolicy(config.model, channels_last=config.channels_last)
        policy.fit_normalizers(stats)
        policy.train()
        ema = copy.deepcopy(policy).requires_grad_(False)
        optimizer = adamw(policy, config)
        generator = torch.Generator().manual_seed(0)

        def forward_backward() -> None:
            optimizer.zero_grad(set_to_none=True)
            policy.compute_loss(batch, generator).backward()

        cond = policy.condition(batch, generator).detach()
        actions = policy.normalize_actions(batch["action"])
        steps = torch.zeros(len(actions), dtype=torch.long)
        forward_backward()
        model = [
            (
                "model: image encoder forward (crop, normalise, CNN)",
                timed(lambda: policy.condition(batch, generator), repeats),
            ),
            ("model: U-Net forward", timed(lambda: policy.denoiser(actions, steps, cond), repeats)),
            ("model: forward and backward", timed(forward_backward, repeats)),
            ("model: gradient clipping", timed(lambda: clip_grad_norm_(policy.parameters(), 1.0), repeats)),
            ("model: optimizer step (AdamW)", timed(optimizer.step, repeats)),
            ("model: EMA update", timed(lambda: ema_update(ema, policy, 0.999), repeats)),
        ]
    finally:
        torch.set_num_threads(previous)
    return [(name, 1000 * seconds) for name, seconds in parts + model]


def print_breakdown(breakdown: list[tuple[str, float]], step_ms: float) -> None:
    print(f"  where a step's time goes (each part alone; a step of the run took {step_ms:.0f} ms):")
    for name, ms in breakdown:
        print(f"    {name:<54} {ms:7.1f} ms  {ms / step_ms:6.1%}")


def train_for_bench(store: Path, stats: dict, config: TrainConfig, run_dir: Path):
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = train(store=store, stats=stats, stats_sha256="bench", config=config, run_dir=run_dir)
    return result, time.perf_counter() - t0


def compare_paths(store: Path, stats: dict, config: TrainConfig, tmp: Path, rounds: int) -> None:
    """The earlier code path and params.yaml's, trained in turn `rounds` times each (ABAB: these
    machines' speed drifts), with each one's step breakdown: both figures from one run."""
    paths = {"earlier path": replace(config, **EARLIER_PATH), "params.yaml's path": config}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(rounds):
        for index, (name, path) in enumerate(paths.items()):  # a run folder each: none resumes another
            result, _ = train_for_bench(store, stats, path, tmp / f"run-{round_}-{index}")
            rates[name].append(result.samples_per_s)
    print(
        f"training, demo config (params.yaml), CPU: {config.steps} steps of batch {config.batch_size}, "
        f"{sum(p.numel() for p in result.policy.parameters()):,} parameters, "
        f"{config.cpu_threads} threads, {config.num_workers} loading workers"
    )
    for name, path in paths.items():
        options = ", ".join(f"{key} {getattr(path, key)}" for key in EARLIER_PATH)
        median = statistics.median(rates[name])
        print(f"  {name} ({options}):")
        each = ", ".join(f"{r:.1f}" for r in rates[name])
        print(f"    samples/s, median of {rounds}          {median:8.1f}  ({each})")
        print_breakdown(step_breakdown(store, stats, path), 1000 * config.batch_size / median)
    ratio = statistics.median(rates["params.yaml's path"]) / statistics.median(rates["earlier path"])
    print(f"  params.yaml's path / earlier path, samples/s: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--gpu", action="store_true", help="the real-robot recipe, bf16, 224x224 (needs CUDA)"
    )
    parser.add_argument(
        "--steps", type=int, help="default: 200 on the CPU (start-up weighs less), 40 with --gpu"
    )
    parser.add_argument("--rounds", type=int, default=2, help="CPU: times each path is trained, in turn")
    args = parser.parse_args()
    if args.gpu:
        require_cuda()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    train_params = params["train"] | REAL_ROBOT if args.gpu else params["train"]
    steps = args.steps or (40 if args.gpu else 200)
    # The train stage's config: the train section with the policy section's windows.
    config = replace(train_config_from_params(train_params, params["policy"]), steps=steps)
    config = replace(config, val_every=10**9, checkpoint_every=10**9, keep_top_k=0, warmup_steps=1)
    # The steps measured are the recipe's (its encoder frozen after pretraining, where it is); the
    # pretraining before them is not what is measured, and is cut to a few steps.
    config = replace(config, encoder_pretrain_steps=min(config.encoder_pretrain_steps, PRETRAIN_STEPS))
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        store, stats_path = build_dataset(
            Path(tmp), recordings=6, image_size=config.model.image_size, window=config.window
        )
        stats = json.loads(stats_path.read_text())
        if not torch.cuda.is_available():
            compare_paths(store, stats, config, Path(tmp), args.rounds)
            return
        result, wall = train_for_bench(store, stats, config, Path(tmp) / "run")
    kind = "the real-robot recipe, bf16, 224x224" if args.gpu else "demo config (params.yaml)"
    print(
        f"training, {kind}, GPU: {steps} steps of batch {config.batch_size}, "
        f"{sum(p.numel() for p in result.policy.parameters()):,} parameters"
    )
    print(f"  samples/s                     {result.samples_per_s:8.1f}")
    print(f"  data-wait fraction            {result.data_wait_fraction:8.3f}")
    print(f"  training loss, last step      {result.last_train_loss:8.4f}")
    print(f"  wall time incl. start-up      {wall:8.1f} s")
    print(f"  peak GPU memory               {torch.cuda.max_memory_allocated() / 2**30:8.2f} GiB")


if __name__ == "__main__":
    main()
