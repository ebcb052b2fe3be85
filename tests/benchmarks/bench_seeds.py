"""Trains one configuration with several seeds on the pipeline's dataset, for claims that must
hold across seeds (docs/training.md, "Measured choices"): a policy per seed, then `policypipe compare`
summarises them with confidence intervals that include seed-to-seed variation.

    python -m tests.benchmarks.bench_seeds --out runs/minmax --seeds 0 1 2 \
        --set train.model.normalization=min_max
    policypipe compare runs/minmax/seed*/policy

Overrides use params.yaml's keys (`--set section.key=value`, the value read as YAML), the way
`dvc exp run -S` does; the rest comes from params.yaml. Seed s sets `train.seed`. The privileged
control (docs/rollout.md): `--set 'train.privileged={seed: 0, recordings: 480, recovery: 0.0}'`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import zarr
from ruamel.yaml import YAML

from policypipe.config import read_section, require_same_window
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.export import save_policy
from policypipe.runtime.spec import spec_of_training
from policypipe.synthetic.privileged import privileged_training
from policypipe.training.config import train_config_from_params
from policypipe.training.loop import train

REPO = Path(__file__).resolve().parents[2]


def override(sections: dict[str, dict], assignment: str) -> None:
    """Applies `section.key.subkey=value` to the params sections in place."""
    path, _, text = assignment.partition("=")
    *parents, leaf = path.split(".")
    target = sections
    for key in parents:
        target = target.setdefault(key, {})
    target[leaf] = YAML(typ="safe", pure=True).load(text)


def progress(record: dict) -> None:
    if "val_loss" in record:
        event = f", event loss {record['val_event_loss']:.4f}" if "val_event_loss" in record else ""
        print(f"  step {record['step']}: val loss {record['val_loss']:.4f}{event}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="one folder per seed is made in it")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--dataset", type=Path, default=REPO / "data/dataset.zarr")
    parser.add_argument("--stats", type=Path, default=REPO / "data/stats/stats.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    sections = {name: read_section(REPO / "params.yaml", name) for name in ("train", "policy")}
    for assignment in args.overrides:
        override(sections, assignment)
    config = train_config_from_params(sections["train"], sections["policy"])
    stats = json.loads(args.stats.read_text())
    require_same_window(stats, asdict(config.window), "the overridden [policy] section")
    row_features = None
    if config.privileged is not None:  # the privileged control, as the train stage trains it
        config, stats, row_features = privileged_training(args.dataset, stats, config)
    # What a runner needs besides the weights, as the train stage writes it (for rollouts).
    spec = spec_of_training(
        dict(zarr.open_group(args.dataset, mode="r").attrs), stats, sha256_file(args.stats)
    )
    spec = replace(spec, open_deadband_m=config.open_deadband_mm / 1000.0)
    for seed in args.seeds:
        folder = args.out / f"seed{seed}"
        started = time.monotonic()
        result = train(
            store=args.dataset,
            stats=stats,
            stats_sha256=sha256_file(args.stats),
            config=replace(config, seed=seed),
            run_dir=folder / "run",
            log_step=progress,
            row_features=row_features,
        )
        save_policy(
            folder / "policy",
            result.policy,
            {
                "dataset_fingerprint": stats["dataset_fingerprint"]["sha256"],
                "stats_sha256": sha256_file(args.stats),
                "steps": result.steps,
                "overrides": args.overrides,
            },
            spec.to_json(),
        )
        print(
            f"seed {seed}: {result.steps} steps, best val loss {result.best_val_loss:.4f}, "
            f"{time.monotonic() - started:.0f} s -> {folder / 'policy'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
