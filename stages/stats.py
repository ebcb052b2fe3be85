"""Stage `stats`: train/validation split, normalization statistics, the dataset report and plots."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import zarr
from common import fail, load_config, setup_logging

from policypipe.atomic import write_json_atomic
from policypipe.dataset.fingerprint import UnreadableArray, fingerprint, store_files
from policypipe.dataset.report import dataset_report, write_plots
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.lineage.provenance import StageRun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True, help="normalization statistics and split (JSON)")
    parser.add_argument("--metrics", type=Path, required=True, help="the dataset report")
    parser.add_argument("--plots", type=Path, required=True, help="folder for the dataset plots")
    parser.add_argument("--provenance", type=Path, required=True)
    args = parser.parse_args()
    setup_logging()
    config = load_config("stats", StatsConfig)
    window = load_config("policy", WindowConfig)

    started = time.monotonic()
    with StageRun("stats", params={"stats": asdict(config), "policy": asdict(window)}) as run:
        try:
            root = zarr.open_group(args.dataset, mode="r")
            print_step("fingerprint")
            digest = fingerprint(root)
            print_step("statistics")
            stats = compute_statistics(root, window, config)
        except (ValueError, UnreadableArray) as exc:
            fail(f"{args.dataset}: {exc}; rebuild it with `dvc repro convert` (or `dvc checkout`)")
        stats["dataset_fingerprint"] = {
            "sha256": digest.digest,
            "arrays": digest.arrays,
            "files": store_files(args.dataset),
        }
        report = dataset_report(root, digest.digest, stats["split"])
        write_json_atomic(args.stats, stats)
        write_json_atomic(args.metrics, report)
        print_step("plots")
        write_plots(root, args.plots, stats["split"])
    run.inputs[args.dataset.as_posix() + "#fingerprint"] = digest.digest
    run.add_outputs([args.stats, args.metrics, args.plots])
    run.write(args.provenance)
    print(
        f"{report['episodes']} episodes ({report['train_episodes']} train / "
        f"{report['val_episodes']} validation / {report['test_episodes']} test), "
        f"{report['frames']} frames, {report['duration_s']:.0f} s; fingerprint {digest.digest[:16]}; "
        f"done in {time.monotonic() - started:.1f} s"
    )


def print_step(name: str) -> None:
    print(f"stats: {name} ...", flush=True)


if __name__ == "__main__":
    main()
