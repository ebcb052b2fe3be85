"""Which ranking of checkpoints picks the better one: the validation loss, or the executed-step
error on fixed validation windows (`train.rank_by`, training/ranking.py)? It reads runs trained
with every checkpoint kept, one run per seed:

    python -m tests.benchmarks.bench_seeds --out runs/ranking --seeds 0 1 2 --set train.keep_top_k=100
    python -m tests.benchmarks.bench_checkpoint_ranking runs/ranking/seed*/run --json ranking.json

Every kept checkpoint's EMA weights predict eval's samples (every `eval.stride`-th anchor, eval's
seeded noise) of the validation side, where the default is chosen, and of the test side, which
chose nothing. Each ranking's pick in a run is its best checkpoint by the run's own history; the
exported policy is the last step's EMA weights. Printed per run: every checkpoint's recorded values
and errors; then, over the runs, each pick's executed errors and the difference between the two
rankings' picks of each seed, with 95% CIs over seeds, then episodes, then samples
(`hierarchical_bootstrap`). Each checkpoint's errors are kept in the run folder
(bench_checkpoint_ranking/), so a rerun only bootstraps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.torch import load_file

from policypipe.atomic import write_json_atomic
from policypipe.config import read_section
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.errors import hierarchical_bootstrap, percentile_ci
from policypipe.evaluation.evaluate import (
    COMPONENTS,
    EvalConfig,
    executed_errors,
    held_out_sides,
    predict,
)
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.checkpoint import LATEST, TrainHistory
from policypipe.training.config import train_config_from_params

REPO = Path(__file__).resolve().parents[2]
PICKS = ("val_loss", "executed_error", "last step")


def checkpoint_steps(run: Path) -> dict[int, Path]:
    """{step: folder} of every checkpoint kept in the run, `latest` (the last step) included."""
    steps = {}
    for folder in sorted((run / "checkpoints").iterdir()):
        if folder.name == LATEST or "-step-" in folder.name:
            trainer = json.loads((folder / "trainer.json").read_text())
            steps.setdefault(trainer["step"], folder)
    return steps


def with_ci(entry: dict, sign: str) -> str:
    low, high = entry["ci95"]
    return f"{entry['mean']:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (seed*/run), every checkpoint kept")
    parser.add_argument("--dataset", type=Path, default=REPO / "data/dataset.zarr")
    parser.add_argument("--stats", type=Path, default=REPO / "data/stats/stats.json")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    config = train_config_from_params(
        read_section(REPO / "params.yaml", "train"), read_section(REPO / "params.yaml", "policy")
    )
    eval_config = EvalConfig(**read_section(REPO / "params.yaml", "eval"))
    stats = json.loads(args.stats.read_text())
    window = WindowConfig(config.model.n_obs_steps, config.model.horizon, config.model.n_action_steps)
    sides = held_out_sides(stats)
    samples = {
        side: collect_samples(args.dataset, eps, window, eval_config.stride) for side, eps in sides.items()
    }
    recorded = {side: s.batch["action"].double().numpy() for side, s in samples.items()}

    def errors_of(run: Path, step: int, ema_file: Path) -> dict[str, dict[str, np.ndarray]]:
        """Each side's per-sample executed errors, kept in the run folder (a rerun reads them; the
        checkpoint folders are left as their manifests describe them)."""
        cache = run / "bench_checkpoint_ranking" / f"step-{step:07d}.npz"
        sizes = {side: len(s) for side, s in samples.items()}
        if cache.exists():
            with np.load(cache) as kept:
                if all(kept[f"{side}/{COMPONENTS[0]}"].shape == (n,) for side, n in sizes.items()):
                    return {side: {c: kept[f"{side}/{c}"] for c in COMPONENTS} for side in sizes}
        errors = compute_errors(ema_file)
        cache.parent.mkdir(exist_ok=True)
        np.savez(cache, **{f"{side}/{c}": errors[side][c] for side in errors for c in COMPONENTS})
        return errors

    def compute_errors(ema_file: Path) -> dict[str, dict[str, np.ndarray]]:
        policy = DiffusionPolicy(config.model)
        policy.fit_normalizers(stats)
        policy.load_state_dict(load_file(ema_file))
        return {
            side: executed_errors(
                predict(policy, s.batch, eval_config.batch_size, eval_config.seed),
                recorded[side],
                window.n_action_steps,
            )
            for side, s in samples.items()
        }

    picked: dict[str, list[dict[str, dict[str, np.ndarray]]]] = {name: [] for name in PICKS}
    table = []
    for run in args.runs:
        history = TrainHistory.from_json(json.loads((run / "history.json").read_text()))
        steps = checkpoint_steps(run)
        errors = {
            step: errors_of(run, step, folder / "ema.safetensors") for step, folder in sorted(steps.items())
        }
        ranked = [
            s
            for s in steps
            if history.value("val_loss", s) is not None and history.value("executed_error", s) is not None
        ]
        choice = {
            "val_loss": min(ranked, key=lambda s: history.value("val_loss", s)),
            "executed_error": min(ranked, key=lambda s: history.value("executed_error", s)),
            "last step": max(steps),
        }
        print(f"\n{run}: picks {choice}")
        print(
            f"  {'step':>5s} {'val loss':>9s} {'probe':>6s}  "
            + "  ".join(f"{side} pos/rot/width" for side in sides)
        )
        for step, e in errors.items():
            row = {
                "run": str(run),
                "step": step,
                "val_loss": history.value("val_loss", step),
                "probe_score": history.value("executed_error", step),
            } | {f"{side}/{c}": float(e[side][c].mean()) for side in sides for c in COMPONENTS}
            table.append(row)
            cells = "  ".join(
                "/".join(f"{e[side][c].mean():.2f}" for c in COMPONENTS).rjust(len(side) + 15)
                for side in sides
            )
            loss = f"{row['val_loss']:.5f}" if row["val_loss"] is not None else "-"
            probe = f"{row['probe_score']:.3f}" if row["probe_score"] is not None else "-"
            print(f"  {step:5d} {loss:>9s} {probe:>6s}  {cells}")
        for name, step in choice.items():
            picked[name].append(errors[step])

    result = {"runs": [str(r) for r in args.runs], "checkpoints": table, "sides": {}}
    for side, s in samples.items():
        # (S, N) per pick: seed by sample; the two rankings' picks of one seed stay paired.
        stacked = {
            name: {c: np.stack([e[side][c] for e in picked[name]]) for c in COMPONENTS} for name in PICKS
        }
        groups = {name: stacked[name] for name in PICKS} | {
            "difference": {c: stacked["executed_error"][c] - stacked["val_loss"][c] for c in COMPONENTS}
        }
        reps = hierarchical_bootstrap(groups, s.episodes, eval_config.seed, eval_config.bootstrap_resamples)
        summary = {
            name: {
                c: {"mean": float(x[c].mean()), "ci95": list(percentile_ci(reps[name][c]))}
                for c in COMPONENTS
            }
            for name, x in groups.items()
        }
        result["sides"][side] = summary
        episodes = len(set(s.episodes.tolist()))
        print(f"\n{side} side ({episodes} episodes, {len(s)} samples), {len(args.runs)} seeds:")
        for name in PICKS:
            print(f"  {name:>15s}: " + ", ".join(with_ci(summary[name][c], "") for c in COMPONENTS))
        print(
            "  executed_error - val_loss: "
            + ", ".join(f"{c} {with_ci(summary['difference'][c], '+')}" for c in COMPONENTS)
        )
    if args.json:
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
