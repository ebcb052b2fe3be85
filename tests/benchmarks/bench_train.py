"""Training benchmark (`make bench`): samples/s and the fraction of step time spent waiting
for data, for the demo config on this machine (its GPU where it has one, as training does).

`--gpu` (`make bench-gpu`) trains the real-robot recipe (`REAL_ROBOT`, docs/training.md, "The
real-robot recipe") for a fixed number of steps on one GPU and prints samples/s, peak GPU memory
and the loss; on a machine without CUDA it refuses in one line before any work."""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml
import zarr
from torch.utils.data import default_collate

from policypipe.atomic import write_json_atomic
from policypipe.config import from_mapping
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.training.config import TrainConfig, model_for_dataset
from policypipe.training.loop import train
from policypipe.training.schedules import ema_update

REPO = Path(__file__).resolve().parents[2]

# The real-robot recipe: the real-robot model size (PolicyConfig's defaults: ResNet-18 widths
# 64-512, U-Net 256-512-1024), 224x224 frames cropped to 216, batch 64 in bf16, 8 loading workers.
# params.yaml's train section with these replacing its own (train.model replaced whole).
REAL_ROBOT = {
    "batch_size": 64,
    "mixed_precision": "bf16",
    "num_workers": 8,
    "model": {"image_size": [224, 224], "crop_size": [216, 216]},
}


def require_cuda() -> None:
    """One line and exit status 2 on a machine where torch sees no CUDA device."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise SystemExit(
            f"bench_train --gpu: no CUDA device here (torch {torch.__version__}, {build}); run it on a "
            "machine with an NVIDIA GPU and a CUDA build of torch"
        )


def build_dataset(tmp: Path, recordings: int, image_size: tuple[int, int]) -> tuple[Path, Path]:
    export = write_sample_export(tmp / "raw", SampleConfig(recordings=recordings, seed=2, defects=False)).root
    write_json_atomic(tmp / "manifest.json", pair_export(export, PairConfig()).manifest())
    convert_dataset(
        tmp / "manifest.json", export, tmp / "ds.zarr", tmp / "cache", ConvertConfig(image_size=image_size)
    )
    root = zarr.open_group(tmp / "ds.zarr", mode="r")
    stats = compute_statistics(root, WindowConfig(), StatsConfig())
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
    """Where a training step's time goes: (part, ms per step), each part timed alone in this
    process on `config.cpu_threads` threads, on one fixed batch of training samples. In training
    the data parts run in the loader's workers, beside the model's (`num_workers`)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(config.cpu_threads)
    try:
        config = replace(config, model=model_for_dataset(config.model, stats))
        data = WindowDataset(store, stats["split"]["train"], config.window)
        picked = np.random.default_rng(0).integers(len(data), size=config.batch_size)
        anchors = data.anchors[picked]
        data[0]  # opens the frame reader
        frames = data._frames[0]
        rows = data.streams.windows(anchors, config.window).obs_frames
        items = [data[int(i)] for i in picked]
        parts = [
            (
                "data: windows (interpolated poses, widths, actions)",
                timed(lambda: data.streams.windows(anchors, config.window), repeats),
            ),
            ("data: frames (JPEG decode)", timed(lambda: [frames.read_many(r) for r in rows], repeats)),
            (
                "data: whole samples (both, to tensors)",
                timed(lambda: [data[int(i)] for i in picked], repeats),
            ),
            ("data: collation", timed(lambda: default_collate(items), repeats)),
        ]
        batch = default_collate(items)
        torch.manual_seed(0)
        policy = DiffusionPolicy(config.model)
        policy.fit_normalizers(stats)
        policy.train()
        ema = copy.deepcopy(policy).requires_grad_(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
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
            ("model: optimizer step (AdamW)", timed(optimizer.step, repeats)),
            ("model: EMA update", timed(lambda: ema_update(ema, policy, 0.999), repeats)),
        ]
    finally:
        torch.set_num_threads(previous)
    return [(name, 1000 * seconds) for name, seconds in parts + model]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--gpu", action="store_true", help="the real-robot recipe, bf16, 224x224 (needs CUDA)"
    )
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if args.gpu:
        require_cuda()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    train_params = params["train"] | REAL_ROBOT if args.gpu else params["train"]
    config = replace(from_mapping(TrainConfig, train_params, "train"), steps=args.steps)
    config = replace(config, val_every=10**9, checkpoint_every=10**9, keep_top_k=0, warmup_steps=1)
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        store, stats_path = build_dataset(Path(tmp), recordings=6, image_size=config.model.image_size)
        stats = json.loads(stats_path.read_text())
        breakdown = [] if args.gpu else step_breakdown(store, stats, config)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = train(
            store=store, stats=stats, stats_sha256="bench", config=config, run_dir=Path(tmp) / "run"
        )
        wall = time.perf_counter() - t0
    device = "GPU" if torch.cuda.is_available() else "CPU"  # training takes the GPU where there is one
    kind = "the real-robot recipe, bf16, 224x224" if args.gpu else "demo config (params.yaml)"
    kind += f", {device}"
    print(
        f"training, {kind}: {args.steps} steps of batch {config.batch_size}, "
        f"{sum(p.numel() for p in result.policy.parameters()):,} parameters"
    )
    print(f"  samples/s                     {result.samples_per_s:8.1f}")
    print(f"  data-wait fraction            {result.data_wait_fraction:8.3f}")
    print(f"  training loss, last step      {result.last_train_loss:8.4f}")
    print(f"  wall time incl. start-up      {wall:8.1f} s")
    if breakdown:
        step_ms = 1000 * config.batch_size / result.samples_per_s
        print(f"  where a step's time goes (each part alone; a step of the run took {step_ms:.0f} ms):")
        for name, ms in breakdown:
            print(f"    {name:<54} {ms:7.1f} ms  {ms / step_ms:6.1%}")
    if torch.cuda.is_available():
        print(f"  peak GPU memory               {torch.cuda.max_memory_allocated() / 2**30:8.2f} GiB")


if __name__ == "__main__":
    main()
