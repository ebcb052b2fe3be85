"""The smoke check teams run before committing GPUs (`policypipe smoke`, `make smoke`).

It builds the model, trains a few steps on real batches, stops part-way with a checkpoint,
restores it in a fresh process and continues, and checks that the resumed run continues
seamlessly: the same step, learning rate and loss at every step, and the same final weights,
as a run that was never interrupted. On CPU "the same" is bitwise; on a GPU, whose kernels are
not bitwise reproducible (atomic adds, split reductions), it is within the tolerances below. It
reports peak memory and works in a scratch folder: no real run directory is touched.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from policypipe.config import from_mapping
from policypipe.lineage.hashing import sha256_file
from policypipe.training.config import TrainConfig
from policypipe.training.loop import train

# On a GPU: learning rate and losses within this fraction of max(1, |value|) of the uninterrupted
# run's, and each final EMA weight tensor within this fraction of its norm (|a - b| <= rtol |a|).
# A resume that restores the wrong state changes the losses after it by far more; these bounds only
# absorb kernel-order noise. Unmeasured on a real GPU so far: widen them if a sound setup fails.
GPU_SCALAR_RTOL = 1e-4
GPU_WEIGHT_RTOL = 1e-3


@dataclass
class SmokeReport:
    steps: int
    resumed_at: int
    problems: list[str]
    comparison: str  # how "the same" was judged: bitwise (CPU) or within the GPU tolerances
    peak_rss_mb: float
    peak_gpu_mb: float | None
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems


def smoke_config(config: TrainConfig, steps: int) -> TrainConfig:
    """The real model and batch size; a short run with frequent checkpoints and validation."""
    return replace(
        config,
        steps=steps,
        warmup_steps=min(config.warmup_steps, 2),
        checkpoint_every=steps,
        val_every=max(1, steps // 2),
        val_batches=1,
        keep_top_k=1,
        fallback_dir=None,
    )


def run_smoke(
    store: Path,
    stats_path: Path,
    config: TrainConfig,
    steps: int = 6,
    between: Callable[[Path], None] | None = None,
    workdir: Path | None = None,
) -> SmokeReport:
    """`between(run_dir)` runs after the interruption, before the resume (tests break things there)."""
    started = time.monotonic()
    config = smoke_config(config, steps)
    stats = json.loads(Path(stats_path).read_text())
    stats_sha = sha256_file(stats_path)
    resume_at = max(1, steps // 2)
    problems: list[str] = []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory(prefix="policypipe-smoke-", dir=workdir) as tmp:
        tmp = Path(tmp)
        reference: list[dict] = []
        train(
            store=store,
            stats=stats,
            stats_sha256=stats_sha,
            config=config,
            run_dir=tmp / "straight",
            log_step=reference.append,
        )
        first_half: list[dict] = []
        train(
            store=store,
            stats=stats,
            stats_sha256=stats_sha,
            config=config,
            run_dir=tmp / "resumed",
            log_step=first_half.append,
            stop_after=resume_at,
        )
        if between is not None:
            between(tmp / "resumed")
        (tmp / "config.json").write_text(json.dumps(asdict(config)))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "policypipe.training.smoke",
                str(store),
                str(stats_path),
                str(tmp / "config.json"),
                str(tmp / "resumed"),
                str(tmp / "second_half.json"),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            problems.append(
                "resuming in a fresh process failed: "
                f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            )
            second_half = []
        else:
            second_half = json.loads((tmp / "second_half.json").read_text())
        if not problems:
            problems += compare_records(reference, first_half + second_half, resume_at, device)
            problems += compare_weights(
                load_file(tmp / "straight" / "checkpoints" / "latest" / "ema.safetensors"),
                load_file(tmp / "resumed" / "checkpoints" / "latest" / "ema.safetensors"),
                device,
            )
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return SmokeReport(
        steps=steps,
        resumed_at=resume_at,
        problems=problems,
        comparison="bitwise"
        if device == "cpu"
        else f"within GPU tolerances (losses {GPU_SCALAR_RTOL:g}, weights {GPU_WEIGHT_RTOL:g} relative)",
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        peak_gpu_mb=peak_gpu,
        seconds=time.monotonic() - started,
    )


def scalars_match(x: float | None, y: float | None, device: str) -> bool:
    """Bitwise on CPU; within GPU_SCALAR_RTOL of max(1, |x|) on a GPU. Absent on one side: differ."""
    if x is None or y is None:
        return x is y
    return x == y if device == "cpu" else abs(x - y) <= GPU_SCALAR_RTOL * max(1.0, abs(x))


def compare_records(reference: list[dict], resumed: list[dict], resume_at: int, device: str) -> list[str]:
    """The per-step records (step, lr, losses) of the resumed run against the uninterrupted one's."""
    want = [r["step"] for r in reference]
    got = [r["step"] for r in resumed]
    if got != want:
        return [f"steps after resuming at {resume_at}: {got}, expected {want}"]
    for a, b in zip(reference, resumed):
        for key in ("lr", "train_loss", "val_loss"):
            if key not in a and key not in b:
                continue
            if not scalars_match(a.get(key), b.get(key), device):
                return [
                    f"step {a['step']}: {key} {b.get(key)} after resuming at step {resume_at}, "
                    f"{a.get(key)} without interruption"
                ]
    return []


def compare_weights(
    straight: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor], device: str
) -> list[str]:
    """Final weights: bitwise on CPU; on a GPU each tensor within GPU_WEIGHT_RTOL of its norm."""

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        if device == "cpu":
            return torch.equal(a, b)
        a, b = a.double(), b.double()
        return a.shape == b.shape and bool((a - b).norm() <= GPU_WEIGHT_RTOL * a.norm())

    differing = [k for k in straight if k not in resumed or not same(straight[k], resumed[k])]
    return [f"final EMA weights differ after resuming: {', '.join(differing[:3])}..."] if differing else []


def _resume_main(store: str, stats_path: str, config_path: str, run_dir: str, out: str) -> None:
    config = from_mapping(TrainConfig, json.loads(Path(config_path).read_text()), "train")
    records: list[dict] = []
    stats = json.loads(Path(stats_path).read_text())
    result = train(
        store=Path(store),
        stats=stats,
        stats_sha256=sha256_file(Path(stats_path)),
        config=config,
        run_dir=Path(run_dir),
        log_step=records.append,
    )
    if result.resumed_from is None:
        raise SystemExit("the run started from scratch instead of resuming")
    Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    _resume_main(*sys.argv[1:6])
