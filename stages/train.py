"""Stage `train`: the Diffusion Policy on the training episodes; checkpoints, the exported policy."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import zarr
from common import PARAMS_FILE, fail, load_config, setup_logging

from policypipe.atomic import write_json_atomic
from policypipe.cluster import in_job, launch, submit
from policypipe.cluster.preemption import StopRequest
from policypipe.config import ConfigError, read_section, require_same_window
from policypipe.dataset import layout
from policypipe.dataset.events import require_events
from policypipe.lineage.hashing import sha256_file, sha256_path
from policypipe.lineage.provenance import StageRun
from policypipe.live_metrics import TrainingLog
from policypipe.monitor.calibration import MonitorConfig, TooFewCalibrationValues, calibrate
from policypipe.policy.export import save_policy
from policypipe.runtime.spec import spec_of_training
from policypipe.synthetic.privileged import privileged_training
from policypipe.training.checkpoint import CheckpointError, best_ranked_ema
from policypipe.training.config import train_config_from_params
from policypipe.training.loop import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name, what in (
        ("--dataset", None),
        ("--stats", None),
        ("--run-dir", "run folder: checkpoints, history, log (persisted)"),
        ("--policy", "the exported policy"),
        ("--metrics", None),
        ("--live", "DVCLive folder (per-step metrics and plots)"),
        ("--provenance", None),
    ):
        parser.add_argument(name, type=Path, required=True, help=what)
    args = parser.parse_args()
    setup_logging()
    # Every value checked, alone and where the two sections meet, before anything is read or written.
    try:
        config = train_config_from_params(
            read_section(PARAMS_FILE, "train"), read_section(PARAMS_FILE, "policy")
        )
        monitor_config = load_config("monitor", MonitorConfig)
        how = launch.how_to_launch(config.launcher, config.num_processes)
        if how == "slurm":  # this same command on each of the job's tasks, and there it trains
            resources = submit.local_resources(config.slurm)
            print(f"Slurm: {submit.check_reachable()}", file=sys.stderr)
            job_id = launch.run_training_job(
                [sys.executable, *sys.argv],
                resources=resources,
                num_processes=config.num_processes,
                run_dir=args.run_dir,
                stdout=sys.stdout,
                stderr=sys.stderr,
            )
            print(f"Slurm job {job_id} finished", file=sys.stderr)
            sys.exit(0)
        if how == "processes":
            sys.exit(launch.run_as_processes(config.num_processes, sys.argv))
        stats = json.loads(args.stats.read_text())
        stats_sha256 = sha256_file(args.stats)
        require_same_window(stats, asdict(config.window), f"params.yaml [policy] (train reads {args.stats})")
    except (ConfigError, submit.SlurmError) as exc:
        fail(str(exc))
    attrs = zarr.open_group(args.dataset, mode="r").attrs
    if attrs.get(layout.ATTRS_FORMAT) != layout.FORMAT_VERSION:
        fail(
            f"{args.dataset} has dataset format {attrs.get(layout.ATTRS_FORMAT)}, this version trains on "
            f"format {layout.FORMAT_VERSION}: rebuild it with `dvc repro convert`"
        )
    image_size = tuple(attrs[layout.ATTRS_IMAGE_SIZE])
    if image_size != config.model.image_size:
        fail(
            f"train.model.image_size {list(config.model.image_size)} differs from "
            f"the dataset's {list(image_size)}: set it to the dataset's (convert.image_size)"
        )

    row_features = None
    if config.privileged is not None:  # the control experiment: the scene's state in place of the camera
        try:
            config, stats, row_features = privileged_training(args.dataset, stats, config)
        except ValueError as exc:
            fail(f"train.privileged: {exc}")

    if config.model.event_labels:  # every recording trained on must have a grasp and a release
        try:
            require_events(stats, stats["split"]["train"] + stats["split"]["val"])
        except ValueError as exc:
            fail(f"{args.stats}: {exc}")

    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        in_job.record_segment()  # where this segment of a Slurm job runs, for the provenance
    started = time.monotonic()
    logger = TrainingLog(config.steps, args.live, args.run_dir / "log.jsonl")
    # Slurm's warning before a time limit (USR1) or a preemption (SIGTERM): checkpoint at the next
    # step boundary and exit with the code that asks for a requeue.
    stop = StopRequest().install()
    params = {"train": asdict(config), "policy": asdict(config.window), "monitor": asdict(monitor_config)}
    with StageRun("train", params=params) as run:
        try:
            result = train(
                store=args.dataset,
                stats=stats,
                stats_sha256=stats_sha256,
                config=config,
                run_dir=args.run_dir,
                log_step=logger,
                stop_requested=lambda: bool(stop),
                row_features=row_features,
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
            sys.exit(in_job.REQUEUE_EXIT_CODE)
        if rank != 0:
            return  # rank 0 alone writes the outputs
        fingerprint = stats["dataset_fingerprint"]["sha256"]
        trained_with = {"dataset_fingerprint": fingerprint, "stats_sha256": stats_sha256}
        # What a robot-side runner needs besides the weights (policypipe.runtime).
        spec = spec_of_training(dict(zarr.open_group(args.dataset, mode="r").attrs), stats, stats_sha256)
        spec = replace(spec, open_deadband_m=config.open_deadband_mm / 1000.0)
        policy, exported = result.policy, {}
        if config.export == "best":
            try:
                ema, exported = best_ranked_ema(args.run_dir)
            except CheckpointError as exc:
                fail(f"train.export best: {exc}")
            policy = copy.deepcopy(result.policy)
            policy.load_state_dict(ema)
        lineage = trained_with | {"steps": result.steps} | exported
        calibration = None
        if not (spec.joint_space or config.model.privileged):  # what the monitor covers (docs/runtime.md)
            try:
                calibration = calibrate(policy.cpu(), spec, args.dataset, stats["split"], monitor_config)
                lineage["monitor"] = asdict(monitor_config)
            except TooFewCalibrationValues as exc:  # the policy is exported without a monitor
                print(f"warning: the policy is exported without its runtime monitor: {exc}", file=sys.stderr)
                lineage["monitor"] = {"not_calibrated": str(exc)}
        save_policy(
            args.policy, policy, lineage, spec.to_json(), calibration.files() if calibration else None
        )
        if calibration is not None:
            chunks = calibration.details["calibration"]["chunks"]
            print(f"train: monitor calibrated on {chunks} validation chunks")
        if exported:
            print(
                f"train: exported the best-ranked checkpoint: step {exported['export_step']} of "
                f"{result.steps}, {exported['rank_by']} {exported['rank_value']:.4g}"
            )
        metrics = result.metrics(args.run_dir, wall_time_s=time.monotonic() - started)
        write_json_atomic(args.metrics, metrics)
    run.inputs[args.dataset.as_posix() + "#fingerprint"] = fingerprint
    run.inputs[args.stats.as_posix()] = stats_sha256
    run.outputs[args.policy.as_posix()] = sha256_path(args.policy)
    if (segments := in_job.segments_so_far()) is not None:
        run.details["slurm_segments"] = segments
    run.add_outputs([args.metrics])
    run.write(args.provenance)
    best = metrics["val_executed_best"]
    executed = (
        "best executed error on the validation windows "
        + ", ".join(f"{name} {value:.4g}" for name, value in best.items() if name != "score")
        + "; "
        if best
        else ""
    )
    print(
        f"trained {result.steps} steps: val loss {metrics['val_loss_first']:.4f} "
        f"-> best {metrics['val_loss_best']:.4f}, {executed}"
        f"{metrics['samples_per_s']:.0f} samples/s, {metrics['wall_time_s']:.0f} s",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
