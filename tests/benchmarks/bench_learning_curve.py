"""Closed-loop success against training budget (docs/rollout.md, "Learning curve"): one run per seed
to the largest budget, its EMA policy exported and rolled out at every budget on the way.

    python -m tests.benchmarks.bench_learning_curve --out runs/curve-default \\
        --budgets 1500 3000 6000 12000 --seeds 0
    python -m tests.benchmarks.bench_learning_curve --out runs/curve-small --image-size 64 64 \\
        --set train.model.crop_size=[56,56] --budgets 3000 6000 12000 24000

A budget's policy is the run's state at that step, reached by stopping and resuming the one run
(`train(stop_after=...)`: exact resume, so the same as had it not stopped): the learning-rate
schedule spans the largest budget, as in Chi et al.'s curves of one run's checkpoints, so a
smaller budget's point is its policy mid-schedule, not a run that annealed at that budget.

`--image-size` converts data/raw (data/manifest.json) again at that frame size into --out, with
params.yaml's convert section otherwise; statistics are computed for the overridden [policy]
windows. `--raw` pairs and converts another export folder instead (data/raw with a round of
`policypipe corrections` added, for the corrections' measurement). `--schedule` sets the
learning-rate schedule's length (default: the largest budget), so that runs on different data can
stop at the same point of the same schedule. Rollouts run on scenes from --first-seed (1000 on: the
rollout stage reports 0-49).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.config import from_mapping, read_section
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.lineage.hashing import sha256_file
from policypipe.lineage.provenance import cpu_model
from policypipe.policy.export import save_policy
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.rollout.report import UNGRASPED, RolloutStageConfig, run_rollouts, wilson_interval
from policypipe.runtime.spec import spec_of_training
from policypipe.training.config import TrainConfig, train_config_from_params
from policypipe.training.loop import train
from tests.benchmarks.bench_seeds import override

REPO = Path(__file__).resolve().parents[2]


def dataset_for(
    out: Path, image_size: tuple[int, int] | None, raw: Path | None = None, cache: Path | None = None
) -> Path:
    """The pipeline's dataset, or `raw` (default data/raw) converted at `image_size` into `out`,
    through the per-recording conversion cache `cache` (default: out/convert-cache)."""
    params = from_mapping(ConvertConfig, read_section(REPO / "params.yaml", "convert"), "convert")
    convert = replace(params, image_size=tuple(image_size or params.image_size))
    if raw is None and convert == params:
        return REPO / "data/dataset.zarr"
    manifest = REPO / "data/manifest.json"
    if raw is not None:
        manifest = out / "manifest.json"
        if not manifest.exists():
            pairing = from_mapping(PairConfig, read_section(REPO / "params.yaml", "pair"), "pair")
            result = pair_export(raw, pairing)
            print(f"{raw}: {len(result.recordings)} recordings paired, {len(result.rejections)} rejected")
            write_json_atomic(manifest, result.manifest())
    store = out / f"dataset-{convert.image_size[0]}x{convert.image_size[1]}.zarr"
    if not store.exists():
        convert_dataset(manifest, raw or REPO / "data/raw", store, cache or out / "convert-cache", convert)
    return store


def statistics_for(store: Path, window, out: Path) -> Path:
    """stats.json for `window` over `store`, as the stats stage computes it (params' stats section)."""
    config = from_mapping(StatsConfig, read_section(REPO / "params.yaml", "stats"), "stats")
    path = out / f"stats-{store.stem}-o{window.n_obs_steps}h{window.horizon}a{window.n_action_steps}.json"
    if not path.exists():
        root = zarr.open_group(store, mode="r")
        stats = compute_statistics(root, window, config)
        stats["dataset_fingerprint"] = {"sha256": fingerprint(root).digest}
        write_json_atomic(path, stats)
    return path


def training_config(image_size: list[int] | None, overrides: list[str]) -> TrainConfig:
    """params.yaml's training, with a benchmark's --image-size and --set SECTION.KEY=VALUE."""
    sections = {name: read_section(REPO / "params.yaml", name) for name in ("train", "policy")}
    if image_size:
        sections["train"].setdefault("model", {})["image_size"] = list(image_size)
    for assignment in overrides:
        override(sections, assignment)
    return train_config_from_params(sections["train"], sections["policy"])


def rollout_summary(policy: Path, stage: RolloutStageConfig, workers: int) -> dict:
    episodes = run_rollouts(policy, stage, workers, [], controllers=("policy",))["policy"]
    won = sum(r.outcome == "success" for r in episodes)
    return {
        "success_rate": won / len(episodes),
        "wilson_ci95": list(wilson_interval(won, len(episodes))),
        "grasp_rate": float(np.mean([r.outcome not in UNGRASPED for r in episodes])),
        "outcomes": {o: sum(r.outcome == o for r in episodes) for o in sorted({r.outcome for r in episodes})},
        # Scene by scene, in scene order: seeds and rounds compare on the same scenes.
        "episode_outcomes": [r.outcome for r in episodes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budgets", type=int, nargs="+", required=True, help="optimizer steps, ascending")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--image-size", type=int, nargs=2, metavar=("WIDTH", "HEIGHT"))
    parser.add_argument("--raw", type=Path, help="an export folder to pair and convert (default: data/raw)")
    parser.add_argument("--schedule", type=int, help="the schedule's steps (default: the largest budget)")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.budgets != sorted(set(args.budgets)):
        parser.error("--budgets must be distinct and ascending")
    if args.schedule is not None and args.schedule < args.budgets[-1]:
        parser.error("--schedule must be at least the largest budget")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    config = training_config(args.image_size, args.overrides)
    config = replace(config, steps=args.schedule or args.budgets[-1])
    store = dataset_for(args.out, args.image_size, args.raw)
    stats_path = statistics_for(store, config.window, args.out)
    stats = json.loads(stats_path.read_text())
    spec = spec_of_training(dict(zarr.open_group(store, mode="r").attrs), stats, sha256_file(stats_path))
    stage = RolloutStageConfig(episodes=args.episodes, first_seed=args.first_seed, videos=0)

    results_path = args.out / "curve.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results |= {
        "cpu_model": cpu_model(),  # samples/s differs about 3x between 2-core machines
        "overrides": args.overrides,
        "image_size": list(config.model.image_size),
        "window": asdict(config.window),
        "batch_size": config.batch_size,
        "scenes": [args.first_seed, args.first_seed + args.episodes - 1],
        "schedule_steps": config.steps,
    }
    points = results.setdefault("points", {})
    for seed in args.seeds:
        run_dir = args.out / f"seed{seed}" / "run"
        train_s = 0.0
        for budget in args.budgets:
            key = f"seed{seed}/step{budget}"
            if key in points:
                train_s = points[key]["train_s"]
                continue
            started = time.monotonic()
            result = train(
                store=store,
                stats=stats,
                stats_sha256=sha256_file(stats_path),
                config=replace(config, seed=seed),
                run_dir=run_dir,
                stop_after=budget,
            )
            train_s += time.monotonic() - started
            policy = args.out / f"seed{seed}" / f"step{budget}" / "policy"
            save_policy(
                policy,
                result.policy,
                {
                    "dataset_fingerprint": stats["dataset_fingerprint"]["sha256"],
                    "stats_sha256": sha256_file(stats_path),
                    "steps": result.steps,
                    "schedule_steps": config.steps,
                    "overrides": args.overrides,
                },
                spec.to_json(),
            )
            started = time.monotonic()
            point = {
                "seed": seed,
                "steps": budget,
                "samples": budget * config.batch_size,
                "train_s": round(train_s, 1),
                "samples_per_s": round(result.samples_per_s, 1),
            } | rollout_summary(policy, stage, args.workers)
            point["rollout_s"] = round(time.monotonic() - started, 1)
            points[key] = point
            write_json_atomic(results_path, results)
            low, high = point["wilson_ci95"]
            print(
                f"seed {seed}, {budget} steps ({point['samples']:,} samples, {train_s / 60:.1f} min): "
                f"success {point['success_rate']:.0%} [{low:.0%}, {high:.0%}], grasped "
                f"{point['grasp_rate']:.0%}; {point['outcomes']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
