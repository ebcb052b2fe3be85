"""Training benchmark (`make bench`): samples/s and the fraction of step time spent waiting
for data, for the demo config on this machine's CPU; `--gpu` runs the real-robot config in
bf16 at 224x224 on a GPU and also prints peak GPU memory."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.config import from_mapping
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.config import PolicyConfig
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.training.config import TrainConfig
from policypipe.training.loop import train

REPO = Path(__file__).resolve().parents[2]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", action="store_true", help="real-robot config, bf16, 224x224 (needs CUDA)")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu needs a CUDA device")
        model = replace(PolicyConfig(), image_size=(224, 224), crop_size=(216, 216))
        config = replace(
            TrainConfig(), steps=args.steps, batch_size=64, mixed_precision="bf16", num_workers=8, model=model
        )
    else:
        config = from_mapping(TrainConfig, params["train"], "train")
        config = replace(config, steps=args.steps)
    config = replace(config, val_every=10**9, checkpoint_every=10**9, keep_top_k=0, warmup_steps=1)
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        store, stats_path = build_dataset(Path(tmp), recordings=6, image_size=config.model.image_size)
        stats = json.loads(stats_path.read_text())
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = train(
            store=store, stats=stats, stats_sha256="bench", config=config, run_dir=Path(tmp) / "run"
        )
        wall = time.perf_counter() - t0
    kind = "real-robot config, bf16, 224x224, GPU" if args.gpu else "demo config (params.yaml), CPU"
    print(
        f"training, {kind}: {args.steps} steps of batch {config.batch_size}, "
        f"{sum(p.numel() for p in result.policy.parameters()):,} parameters"
    )
    print(f"  samples/s                     {result.samples_per_s:8.1f}")
    print(f"  data-wait fraction            {result.data_wait_fraction:8.3f}")
    print(f"  wall time incl. start-up      {wall:8.1f} s")
    if torch.cuda.is_available():
        print(f"  peak GPU memory               {torch.cuda.max_memory_allocated() / 2**30:8.2f} GiB")


if __name__ == "__main__":
    main()
