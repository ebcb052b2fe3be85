"""Closed-loop success after rounds of corrections (DAgger; docs/rollout.md, "Corrections"): per
training seed, the plain policy, then round after round of `policypipe corrections` from the last
round's policy, each round's policy trained afresh on everything so far at the same budget.

    python -m tests.benchmarks.bench_corrections --out runs/dagger --rounds 3 --seeds 0 1 2 \\
        --image-size 64 64 --set train.model.crop_size=[56,56] --set train.batch_size=128 \\
        --set policy.n_obs_steps=1 --set train.steps=750

For seed s and round r (0: no corrections), the export is --raw (default data/raw) with rounds 1..r
of seed s's own corrections beside its sessions (hard links; a correction round is written by the
policy of round r - 1 of the same seed, with its noise seeded s). Every round's policy trains from
scratch for train.steps with training seed s, so rounds differ only in their data. Rollouts run on
scenes from --first-seed (1000 on, where choices are made; the rollout stage reports 0-49), and the
correction rounds on their own scenes (`corrections.correction_scene`), which no rollout uses.
`--rounds 0 --raw RECOVERY_EXPORT` measures another export (recovery demonstrations) the same way.
Results go to OUT/results.json as they come; a rerun skips what is there.

`--table` prints the measured table instead of measuring (`--also LABEL=DIR` adds another run's
rows, e.g. the recovery export's), and `--docs BLOCK` writes it into docs/rollout.md between
`<!-- bench:BLOCK ... -->` and `<!-- /bench:BLOCK -->`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.lineage.hashing import sha256_file
from policypipe.lineage.provenance import cpu_model
from policypipe.policy.export import save_policy
from policypipe.rollout.corrections import CorrectionConfig, session_folder, write_corrections
from policypipe.rollout.report import UNGRASPED, RolloutStageConfig, wilson_interval
from policypipe.runtime.spec import spec_of_training
from policypipe.training.loop import train
from tests.benchmarks.bench_learning_curve import (
    REPO,
    dataset_for,
    rollout_summary,
    statistics_for,
    training_config,
)
from tests.benchmarks.bench_rollout_success import success_ci_over_seeds_and_scenes
from tests.benchmarks.docs_block import replace_block


def linked_export(source: Path, target: Path) -> Path:
    """`target` as a copy of the export `source` made of hard links (no file is written in place:
    corrections add session folders beside the copied ones)."""
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial, copy_function=os.link)
        os.replace(partial, target)
    return target


def table(runs: dict[str, dict]) -> str:
    """A Markdown table of measured rounds, one row per run and round: each seed's success, then
    over seeds the mean with its 95 % CI over seeds and scenes (where the results hold each
    episode's outcome) and the pooled Wilson interval, the grasp rate, and the most frequent
    outcomes. `runs` maps a label to a results.json."""
    lines = [
        "| data | recordings (per seed) | success per seed | success, mean over seeds [95 % CI] "
        "| pooled Wilson 95 % | grasped | outcomes, all seeds |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, results in runs.items():
        by_round: dict[int, list[dict]] = {}
        for point in results["points"].values():
            by_round.setdefault(point["round"], []).append(point)
        for round_, points in sorted(by_round.items()):
            points.sort(key=lambda p: p["seed"])
            outcomes = sum((Counter(p["outcomes"]) for p in points), Counter())
            episodes = outcomes.total()
            mean = sum(p["success_rate"] for p in points) / len(points)
            interval = ""
            if all("episode_outcomes" in p for p in points):
                matrix = np.array([[o == "success" for o in p["episode_outcomes"]] for p in points], float)
                low, high = success_ci_over_seeds_and_scenes(matrix)
                interval = f" [{100 * low:.1f}, {100 * high:.1f}]"
            pooled = wilson_interval(outcomes["success"], episodes)
            grasped = sum(n for o, n in outcomes.items() if o not in UNGRASPED) / episodes
            top = ", ".join(
                f"{n} {o.replace('_', ' ')}" for o, n in sorted(outcomes.items(), key=lambda x: (-x[1], x[0]))
            )
            per_seed = ", ".join(f"{p['success_rate']:.0%}" for p in points)
            name = label if round_ == 0 else f"{label} and {round_} round{'s' * (round_ > 1)} of corrections"
            lines.append(
                f"| {name} | {', '.join(str(p['recordings']) for p in points)} "
                f"| {per_seed} "
                f"| {100 * mean:.1f} %{interval} | [{100 * pooled[0]:.1f}, {100 * pooled[1]:.1f}] "
                f"| {grasped:.0%} | {top} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3, help="correction rounds after the plain policy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--image-size", type=int, nargs=2, metavar=("WIDTH", "HEIGHT"))
    parser.add_argument("--raw", type=Path, default=REPO / "data/raw", help="the export to start from")
    parser.add_argument("--correction-episodes", type=int, default=50, help="scenes a round drives in")
    parser.add_argument("--takeover-every", type=float, default=2.0)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--table", action="store_true", help="print the table of --out, measure nothing")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=DIR", help="with --table")
    parser.add_argument("--label", default="plain", help="with --table: the label of --out's rows")
    parser.add_argument("--docs", metavar="BLOCK", help="with --table: write it into docs/rollout.md")
    args = parser.parse_args()
    if args.table:
        runs = {args.label: args.out}
        for assignment in args.also:
            label, sep, folder = assignment.partition("=")
            if not sep:
                parser.error(f"--also {assignment!r}: expected LABEL=DIR")
            runs[label] = Path(folder)
        missing = [str(d / "results.json") for d in runs.values() if not (d / "results.json").exists()]
        if missing:
            parser.error(f"no results in {', '.join(missing)}: run the benchmark there first")
        text = table({label: json.loads((d / "results.json").read_text()) for label, d in runs.items()})
        print(text, end="")
        if args.docs:
            replace_block(REPO / "docs/rollout.md", args.docs, text)
        return
    if args.rounds < 0:
        parser.error("--rounds must be 0 or more")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    config = training_config(args.image_size, args.overrides)
    stage = RolloutStageConfig(episodes=args.episodes, first_seed=args.first_seed, videos=0)

    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results |= {
        "cpu_model": cpu_model(),  # the minutes below differ about 3x between 2-core machines
        "raw": str(args.raw),
        "overrides": args.overrides,
        "image_size": list(config.model.image_size),
        "window": asdict(config.window),
        "batch_size": config.batch_size,
        "steps": config.steps,
        "samples": config.steps * config.batch_size,
        "scenes": [args.first_seed, args.first_seed + args.episodes - 1],
        "correction_episodes": args.correction_episodes,
        "takeover_every_s": args.takeover_every,
    }
    points = results.setdefault("points", {})
    for seed in args.seeds:
        seed_dir = args.out / f"seed{seed}"
        export = linked_export(args.raw, seed_dir / "export")
        for round_ in range(args.rounds + 1):
            key = f"seed{seed}/round{round_}"
            round_dir = seed_dir / f"round{round_}"
            policy = round_dir / "policy"
            if key not in points:
                started = time.monotonic()
                store = dataset_for(round_dir, args.image_size, export, cache=seed_dir / "convert-cache")
                stats_path = statistics_for(store, config.window, round_dir)
                stats = json.loads(stats_path.read_text())
                recordings = len(json.loads((round_dir / "manifest.json").read_text())["recordings"])
                convert_s = time.monotonic() - started
                started = time.monotonic()
                result = train(
                    store=store,
                    stats=stats,
                    stats_sha256=sha256_file(stats_path),
                    config=replace(config, seed=seed),
                    run_dir=round_dir / "run",
                )
                train_s = time.monotonic() - started
                spec = spec_of_training(
                    dict(zarr.open_group(store, mode="r").attrs), stats, sha256_file(stats_path)
                )
                save_policy(
                    policy,
                    result.policy,
                    {
                        "dataset_fingerprint": stats["dataset_fingerprint"]["sha256"],
                        "stats_sha256": sha256_file(stats_path),
                        "steps": result.steps,
                        "overrides": args.overrides,
                        "correction_rounds": round_,
                    },
                    spec.to_json(),
                )
                started = time.monotonic()
                point = {
                    "seed": seed,
                    "round": round_,
                    "recordings": recordings,
                    "convert_s": round(convert_s, 1),
                    "train_s": round(train_s, 1),
                    "samples_per_s": round(result.samples_per_s, 1),
                } | rollout_summary(policy, stage, args.workers)
                point["rollout_s"] = round(time.monotonic() - started, 1)
                points[key] = point
                write_json_atomic(results_path, results)
                low, high = point["wilson_ci95"]
                print(
                    f"seed {seed}, round {round_} ({recordings} recordings, {train_s / 60:.1f} min "
                    f"training): success {point['success_rate']:.0%} [{low:.0%}, {high:.0%}], grasped "
                    f"{point['grasp_rate']:.0%}; {point['outcomes']}",
                    flush=True,
                )
            next_round = round_ + 1
            if next_round <= args.rounds and not (export / session_folder(next_round)).exists():
                started = time.monotonic()
                folder, scenes = write_corrections(
                    policy,
                    export,
                    CorrectionConfig(
                        round=next_round,
                        episodes=args.correction_episodes,
                        takeover_every_s=args.takeover_every,
                        seed=seed,
                    ),
                    workers=args.workers,
                )
                written = sum(len(s.stems) for s in scenes)
                points[key]["next_round"] = {
                    "corrections": written,
                    "corrections_s": round(time.monotonic() - started, 1),
                }
                write_json_atomic(results_path, results)
                print(f"seed {seed}: round {next_round}, {written} corrections in {folder}", flush=True)


if __name__ == "__main__":
    main()
