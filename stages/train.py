"""Stage `train`: the Diffusion Policy on the training episodes; checkpoints, the exported policy."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import zarr
from common import PARAMS_FILE, fail, setup_logging
from tqdm import tqdm

from policypipe.atomic import write_json_atomic
from policypipe.cluster import slurm
from policypipe.cluster.preemption import StopRequest
from policypipe.config import ConfigError, read_section, require_same_window
from policypipe.dataset import layout
from policypipe.lineage.hashing import sha256_file, sha256_path
from policypipe.lineage.provenance import StageRun
from policypipe.policy.export import save_policy
from policypipe.training.checkpoint import CheckpointError
from policypipe.training.config import train_config_from_params
from policypipe.training.loop import train


class Logger:
    """Progress bar, JSON-lines log and DVCLive, all written as they happen (rank 0 only)."""

    def __init__(self, total: int, live_dir: Path, jsonl: Path) -> None:
        self.total, self.live_dir, self.jsonl = total, live_dir, jsonl
        self.bar = None
        self.live = None

    def __call__(self, record: dict) -> None:
        from dvclive import Live

        if self.live is None:
            resumed = record["step"] > 1
            # dvcyaml=None: metrics and plots are declared in dvc.yaml by hand, never rewritten.
            self.live = Live(
                str(self.live_dir), resume=resumed, save_dvc_exp=False, dvcyaml=None, report=None
            )
            self.bar = tqdm(
                total=self.total, initial=record["step"] - 1, desc="train", unit="step", dynamic_ncols=True
            )
            if not resumed:
                self.jsonl.unlink(missing_ok=True)
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        self.live.step = record["step"]
        for key, value in record.items():
            if key != "step":
                self.live.log_metric(f"train/{key}" if key != "val_loss" else "val/loss", value)
        self.live.next_step()
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{record['train_loss']:.4f}",
            **({"val": f"{record['val_loss']:.4f}"} if "val_loss" in record else {}),
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.live is not None:
            self.live.end()


def relaunch(processes: int) -> None:
    """Runs this stage again as `processes` processes (one a GPU, or CPU processes with gloo).

    torch's launcher sets the environment accelerate reads; for several machines, start the
    stage with `accelerate launch` and your accelerate config instead: nothing is relaunched then.
    """
    # --standalone: a rendezvous on this machine, on a port the launcher picks itself.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        sys.argv[0],
        *sys.argv[1:],
    ]
    sys.exit(subprocess.call(command))


def submit_to_slurm(config, run_dir: Path) -> None:
    """Runs this stage as one Slurm job (train.launcher: slurm), streaming its log; does not return.

    The job runs this same command on each of its tasks, and there the stage trains. Requeued
    after a preemption, it resumes from the checkpoint written on Slurm's warning signal.
    """
    try:
        resources = slurm.local_resources(config.slurm)
        print(f"Slurm: {slurm.check_reachable()}", file=sys.stderr)
        job_id = slurm.run_stage_as_job(
            [sys.executable, *sys.argv],
            cwd=Path.cwd(),
            folder=run_dir.parent / f"{run_dir.name}.slurm",
            resources=resources,
            num_processes=config.num_processes,
            job_name="policypipe-train",
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
    except slurm.SlurmError as exc:
        fail(str(exc))
    print(f"Slurm job {job_id} finished", file=sys.stderr)
    sys.exit(0)


def segments_so_far() -> list[dict] | None:
    """This Slurm job's segments (one per start or requeue), or None outside a Slurm launch."""
    path = os.environ.get(slurm.SEGMENTS_ENV)
    if not path or not Path(path).is_file():
        return None
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument(
        "--run-dir", type=Path, required=True, help="run folder: checkpoints, history, log (persisted)"
    )
    parser.add_argument("--policy", type=Path, required=True, help="the exported policy")
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument(
        "--live", type=Path, required=True, help="DVCLive folder (per-step metrics and plots)"
    )
    parser.add_argument("--provenance", type=Path, required=True)
    args = parser.parse_args()
    setup_logging()
    # Every value checked, alone and where the two sections meet, before anything is read or written.
    try:
        config = train_config_from_params(
            read_section(PARAMS_FILE, "train"), read_section(PARAMS_FILE, "policy")
        )
    except ConfigError as exc:
        fail(str(exc))
    window = config.window
    if config.launcher == "slurm" and slurm.IN_ALLOCATION_ENV not in os.environ:
        submit_to_slurm(config, args.run_dir)  # does not return
    if config.launcher == "local" and config.num_processes > 1 and "WORLD_SIZE" not in os.environ:
        relaunch(config.num_processes)  # does not return
    rank = int(os.environ.get("RANK", "0"))
    stats = json.loads(args.stats.read_text())
    try:
        require_same_window(stats, asdict(window), f"params.yaml [policy] (train reads {args.stats})")
    except ConfigError as exc:
        fail(str(exc))
    image_size = tuple(zarr.open_group(args.dataset, mode="r").attrs[layout.ATTRS_IMAGE_SIZE])
    if image_size != config.model.image_size:
        fail(
            f"train.model.image_size {list(config.model.image_size)} differs from "
            f"the dataset's {list(image_size)}: "
            "set it to the dataset's (convert.image_size)"
        )

    if rank == 0 and (segments := os.environ.get(slurm.SEGMENTS_ENV)):
        with open(segments, "a") as f:  # where this segment of the Slurm job runs, for the provenance
            f.write(json.dumps(slurm.segment_record()) + "\n")
    started = time.monotonic()
    logger = Logger(config.steps, args.live, args.run_dir / "log.jsonl")
    # Slurm's warning before a time limit (USR1) or a preemption (SIGTERM): checkpoint at the next
    # step boundary and exit with the code that asks for a requeue.
    stop = StopRequest().install()
    with StageRun("train", params={"train": asdict(config), "policy": asdict(window)}) as run:
        try:
            result = train(
                store=args.dataset,
                stats=stats,
                stats_sha256=sha256_file(args.stats),
                config=config,
                run_dir=args.run_dir,
                log_step=logger,
                stop_requested=lambda: bool(stop),
            )
        except CheckpointError as exc:
            fail(str(exc))
        finally:
            logger.close()
            stop.uninstall()
        if result.interrupted:
            print(
                f"{stop.signal}: stopped at step {result.steps} with a checkpoint; "
                "rerun (or requeue) to continue",
                file=sys.stderr,
            )
            sys.exit(slurm.REQUEUE_EXIT_CODE)
        if rank != 0:
            return  # rank 0 alone writes the outputs
        fingerprint = stats["dataset_fingerprint"]["sha256"]
        save_policy(
            args.policy,
            result.policy,
            {
                "dataset_fingerprint": fingerprint,
                "stats_sha256": sha256_file(args.stats),
                "steps": result.steps,
            },
        )
        latest = args.run_dir / "checkpoints" / "latest"
        metrics = {
            "steps": result.steps,
            "resumed_from_step": result.resumed_from,
            "val_loss_first": result.first_val_loss,
            "val_loss_best": result.best_val_loss,
            "train_loss_last": result.last_train_loss,
            "samples_per_s": round(result.samples_per_s, 2),
            "data_wait_fraction": round(result.data_wait_fraction, 4),
            "wall_time_s": round(time.monotonic() - started, 1),
            "checkpoint_bytes": sum(p.stat().st_size for p in latest.iterdir()) if latest.exists() else None,
            "parameters": sum(p.numel() for p in result.policy.parameters()),
            "checkpoint_warnings": result.checkpoint_warnings,
            "oom_adjustments": result.oom_adjustments,
        }
        write_json_atomic(args.metrics, metrics)
    run.inputs[args.dataset.as_posix() + "#fingerprint"] = fingerprint
    run.inputs[args.stats.as_posix()] = sha256_file(args.stats)
    run.outputs[args.policy.as_posix()] = sha256_path(args.policy)
    if (segments := segments_so_far()) is not None:
        run.details["slurm_segments"] = segments
    run.add_outputs([args.metrics])
    run.write(args.provenance)
    print(
        f"trained {result.steps} steps: val loss {metrics['val_loss_first']:.4f} "
        f"-> best {metrics['val_loss_best']:.4f}, "
        f"{metrics['samples_per_s']:.0f} samples/s, {metrics['wall_time_s']:.0f} s",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
