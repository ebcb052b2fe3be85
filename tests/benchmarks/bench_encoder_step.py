"""The image encoder's training step at the demo's sizes (56x56 crops, batch 128, the demo's
widths), with and without the stem's max-pool (docs/rollout.md, "A finer feature map"): forward,
backward and AdamW, as times relative to the demo's encoder measured in the same run.

    python -m tests.benchmarks.bench_encoder_step [--threads 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from policypipe.policy.config import encoder_feature_map_size
from policypipe.policy.encoder import ImageEncoder

CROP = (56, 56)
VARIANTS = {  # name: (widths, stem_pool)
    "the demo's: four stages, max-pool": ((16, 32, 64, 128), True),
    "three stages, max-pool": ((16, 32, 64), True),
    "four stages, no max-pool": ((16, 32, 64, 128), False),
    "three stages, no max-pool": ((16, 32, 64), False),
}


def seconds_per_step(widths: tuple[int, ...], stem_pool: bool, steps: int, batch: int) -> float:
    torch.manual_seed(0)
    encoder = ImageEncoder(widths, feature_dim=64, num_keypoints=32, stem_pool=stem_pool)
    encoder = encoder.to(memory_format=torch.channels_last)  # as training lays its crops out
    optimizer = torch.optim.AdamW(encoder.parameters())
    images = torch.randn(batch, 3, CROP[1], CROP[0]).contiguous(memory_format=torch.channels_last)

    def step() -> None:
        optimizer.zero_grad()
        encoder(images).square().mean().backward()
        optimizer.step()

    for _ in range(2):  # warm-up: allocations, oneDNN's kernels chosen
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="as train.cpu_threads")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    baseline = None
    for name, (widths, stem_pool) in VARIANTS.items():
        seconds = seconds_per_step(widths, stem_pool, args.steps, args.batch)
        baseline = baseline or seconds
        w, h = encoder_feature_map_size(CROP, widths, stem_pool)
        ratio = seconds / baseline
        print(f"{name:36s} last map {w}x{h}: {seconds * 1000:6.1f} ms a step, {ratio:.2f}x the demo's")


if __name__ == "__main__":
    main()
