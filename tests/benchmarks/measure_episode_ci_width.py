"""How much wider are eval's confidence intervals over episodes than a bootstrap over single
samples would make them? The demo's policy on each held-out side: the 95% CI of its executed error
and of its ratio to the best baseline, by eval's bootstrap (episodes, then samples within them)
and by one that draws samples alone, as eval did before (docs/evaluation.md, "Results"). Run after
`make demo`, from the repository root: `python -m tests.benchmarks.measure_episode_ci_width`."""

import json
from pathlib import Path

import numpy as np

from policypipe.config import read_section
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.errors import seeds_summary
from policypipe.evaluation.evaluate import (
    COMPONENTS,
    Baselines,
    EvalConfig,
    executed_errors,
    held_out_sides,
    predict,
)
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.export import load_policy

root = Path.cwd()
store = root / "data/dataset.zarr"
stats = json.loads((root / "data/stats/stats.json").read_text())
policy = load_policy(root / "data/policy")
window = WindowConfig(policy.config.n_obs_steps, policy.config.horizon, policy.config.n_action_steps)
config = EvalConfig(**read_section(root / "params.yaml", "eval"))
baselines = Baselines.build(store, stats, window, config)


def width(ci) -> float:
    return ci[1] - ci[0]


for side, episodes in held_out_sides(stats).items():
    samples = collect_samples(store, episodes, window, config.stride)
    recorded = samples.batch["action"].double().numpy()
    chunks = predict(policy, samples.batch, config.batch_size, config.seed)
    errors = executed_errors(chunks, recorded, window.n_action_steps)
    baseline_errors = {
        name: executed_errors(chunk, recorded, window.n_action_steps)
        for name, chunk in baselines.chunks(samples)[0].items()
    }
    over_episodes = seeds_summary(
        {c: errors[c][None] for c in COMPONENTS},
        None,
        baseline_errors,
        samples.episodes,
        config.seed,
        config.bootstrap_resamples,
    )
    draws = np.random.default_rng(config.seed).integers(
        0, len(samples), size=(config.bootstrap_resamples, len(samples))
    )
    print(
        f"{side}: {len(samples)} samples of {len(episodes)} episodes; CI width over episodes / over samples"
    )
    for c in COMPONENTS:
        entry = over_episodes[c]
        best = entry["best_baseline"]
        error_alone = np.percentile(errors[c][draws].mean(axis=1), [2.5, 97.5])
        ratio_alone = np.percentile(
            errors[c][draws].mean(axis=1) / baseline_errors[best][c][draws].mean(axis=1), [2.5, 97.5]
        )
        print(
            f"  {c}: error x{width(entry['policy']['ci95']) / width(error_alone):.2f}, "
            f"ratio to {best} x{width(entry['ratio_to_best_baseline']['ci95']) / width(ratio_alone):.2f}"
        )
