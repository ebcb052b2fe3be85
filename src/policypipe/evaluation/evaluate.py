"""Offline evaluation of a policy on the held-out episodes, against baselines.

Two held-out sides, from the split of `stats`: the test side, the headline, on which nothing was
chosen, and validation beside it, on which the settings were (each reported alone, labelled).
At evenly spaced timesteps of a side's episodes the recorded observations go to the policy (EMA
weights, DDIM, seeded noise) and its action chunk is compared with the recorded future.
Baselines on the same samples, none of them learned: "hold still", "mean motion" (the training
episodes' mean relative trajectory), "constant velocity" (the last recorded motion continued)
and "nearest neighbour" (the mean chunk of the nearest training windows, `nearest_neighbour`);
every policy error is also a ratio to the best of them. The last two read two observation steps
of the recording at least (`motion_window`), whatever the policy observes. Camera ablations: the
policy fed the frames of a sample from another episode of the side (in-distribution images that
do not belong to the pose), and a constant image. The spread of several samples for one observation measures
multimodality. Position and width errors are also reported apart where the recorded gripper
moves and where it is still (`moving_samples`).

Every 95% CI resamples episodes, then samples within them (and seeds first, in `compare`): the
samples of one episode share its target and trajectory, so the episode is the unit that
generalises.

Only data errors (an unreadable episode, in `collect_samples`) are skipped and counted; any other
exception propagates: a bug must fail the evaluation, not shrink it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from policypipe.dataset import layout
from policypipe.dataset.windows import EpisodeStreams, WindowConfig
from policypipe.evaluation.errors import (
    CI_METHOD,
    COMPONENTS,
    bootstrap_mean_ci,
    chunk_errors,
    ci_scope,
    constant_velocity,
    difference_summary,
    executed_errors,
    foreign_episode_partners,
    gripper_chunks,
    hold_still,
    mean_pairwise_distance_mm,
    moving_samples,
    seeds_summary,
    summarize,
    whole_errors,
)
from policypipe.evaluation.nearest_neighbour import NearestNeighbourConfig, NearestNeighbourIndex
from policypipe.evaluation.probe import encoder_probe
from policypipe.evaluation.samples import (
    Samples,
    collect_samples,
    mean_motion,
    motion_window,
    recorded_observations,
)
from policypipe.policy.diffusion import DiffusionPolicy

log = logging.getLogger(__name__)

BASELINES = ("hold_still", "mean_motion", "constant_velocity", "nearest_neighbour")
ABLATION_OTHER_EPISODES = "camera_ablation_other_episodes"
ABLATION_CONSTANT_IMAGE = "camera_ablation_constant_image"
ABLATION_ABSENT = "camera_ablation_absent"  # camera k >= 1 only
# An ablation's chunk name: its kind, and for camera k >= 1 the camera.
ABLATION_NAME = re.compile(r"^camera_ablation_(other_episodes|constant_image|absent)(?:_camera([0-9]+))?$")


@dataclass(frozen=True)
class EvalConfig:
    """`eval` section of params.yaml."""

    seed: int = 0
    # Every `stride`-th anchor frame of each held-out episode is a sample (the frames training samples).
    stride: int = 8
    batch_size: int = 64
    # Multimodality: this many noise samples for each of `spread_observations` observations.
    spread_samples: int = 8
    spread_observations: int = 16
    plot_episodes: int = 3
    # Bootstrap resamples behind every 95% confidence interval.
    bootstrap_resamples: int = 2000
    # A sample is "moving" in position if the recorded position leaves the current one by more than
    # this at some executed step, in width if the recorded width changes by more than this.
    moving_position_mm: float = 5.0
    moving_width_mm: float = 1.0
    # The nearest-neighbour baseline (`nearest_neighbour`): the mean chunk of the nn_k nearest
    # training windows, by the previous poses, the widths and the current frame at nn_image_size
    # pixels square, weighted per block; every nn_train_stride-th training anchor. Chosen once on
    # the demo's validation samples (docs/evaluation.md), not tuned per run.
    nn_k: int = 8
    nn_pose_weight: float = 0.5
    nn_width_weight: float = 2.0
    nn_pixel_weight: float = 1.0
    nn_image_size: int = 12
    nn_train_stride: int = 1

    def __post_init__(self) -> None:
        self.nearest_neighbour()  # its checks, before any work
        if self.stride < 1 or self.batch_size < 1 or self.spread_samples < 2 or self.spread_observations < 1:
            raise ValueError("stride, batch_size, spread_observations must be >= 1 and spread_samples >= 2")
        if self.bootstrap_resamples < 100:
            raise ValueError(
                f"bootstrap_resamples must be >= 100 for a 95% interval, got {self.bootstrap_resamples}"
            )
        if self.moving_position_mm < 0 or self.moving_width_mm < 0:
            raise ValueError("moving_position_mm and moving_width_mm must be >= 0")

    def nearest_neighbour(self) -> NearestNeighbourConfig:
        weights = {"pose": self.nn_pose_weight, "width": self.nn_width_weight, "pixels": self.nn_pixel_weight}
        return NearestNeighbourConfig(self.nn_k, weights, self.nn_image_size, self.nn_train_stride)


@torch.no_grad()
def predict(
    policy: DiffusionPolicy, batch: dict[str, torch.Tensor], batch_size: int, seed: int
) -> np.ndarray:
    """(N, T, 10 G) predicted chunks (joint space: (N, T, D)); noise seeded per batch, so results
    are reproducible."""
    policy.eval()
    out = []
    n = len(batch["obs_images"])
    for b, s in enumerate(range(0, n, batch_size)):
        # contiguous(): an expanded constant image is a view with stride 0; the policy gets its own copy.
        part = {k: v[s : s + batch_size].contiguous() for k, v in batch.items() if k != "action"}
        generator = torch.Generator().manual_seed(seed * 1_000_003 + b)
        out.append(policy.predict_action(part, generator).double().numpy())
    return np.concatenate(out)


def training_width_ranges(stats: dict[str, Any]) -> list[tuple[float, float]] | None:
    """Per gripper, (min, max) width of the training episodes, from the statistics (None if absent)."""
    width = stats.get("lowdim", {}).get("obs.gripper_width")
    return [(float(lo), float(hi)) for lo, hi in zip(width["min"], width["max"])] if width else None


@dataclass(frozen=True)
class Baselines:
    """The learning-free baselines, built once from the training episodes for every side."""

    window: WindowConfig  # the policy's: the samples'
    streams: EpisodeStreams  # the recording, for the samples' observations over `motion`
    mean_motion: np.ndarray  # (T, 10 G)
    width_ranges: list[tuple[float, float]] | None  # per gripper
    nearest_neighbour: NearestNeighbourIndex

    @property
    def motion(self) -> WindowConfig:
        """What constant velocity and the nearest neighbour read (`motion_window`)."""
        return motion_window(self.window)

    @classmethod
    def build(cls, store: Path, stats: dict[str, Any], window: WindowConfig, config: EvalConfig) -> Baselines:
        train = stats["split"]["train"]
        width_ranges = training_width_ranges(stats)
        if width_ranges is None:
            log.warning(
                "the statistics hold no training width range: constant velocity's width is not clipped"
            )
        streams = EpisodeStreams.from_store(zarr.open_group(store, mode="r"))
        return cls(
            window,
            streams,
            mean_motion(streams, train, window),
            width_ranges,
            NearestNeighbourIndex.build(store, train, motion_window(window), config.nearest_neighbour()),
        )

    def chunks(self, samples: Samples) -> tuple[dict[str, np.ndarray], float]:
        """The baselines' chunks (N, T, 10 G) on the samples and the nearest neighbour's search
        seconds. Each gripper's constant velocity continues its own recorded motion; the nearest
        neighbour's windows are found by every gripper's recorded poses and widths and camera 0's
        frame."""
        horizon = self.window.horizon
        recorded = recorded_observations(samples, ("obs_pose", "obs_width"), self.motion, self.streams)
        obs_pose, obs_width = recorded["obs_pose"], recorded["obs_width"]
        grippers = obs_width.shape[-1]
        ranges = self.width_ranges or [None] * grippers
        chunks = {
            "hold_still": hold_still(len(samples), horizon, grippers),
            "mean_motion": np.broadcast_to(self.mean_motion, (len(samples), *self.mean_motion.shape)),
            "constant_velocity": np.concatenate(
                [  # gripper g's own poses come first in obs_pose (`observation_names`)
                    constant_velocity(
                        obs_pose[..., 9 * g : 9 * g + 9], obs_width[..., g : g + 1], horizon, ranges[g]
                    )
                    for g in range(grippers)
                ],
                axis=-1,
            ),
        }
        chunks["nearest_neighbour"], search_s = self.nearest_neighbour.chunks_for(
            obs_pose, obs_width, samples.batch["obs_images"][:, -1].numpy()
        )
        return chunks, search_s


def held_out_sides(stats: dict[str, Any]) -> dict[str, list[int]]:
    """{side: episodes} that eval reports, the headline first: the test side, which chose nothing,
    then validation, which chose the settings (validation alone when there is no test side)."""
    split = stats["split"]
    if "test" not in split:
        raise ValueError(
            "the statistics predate the test side (their split has no 'test'): rerun `dvc repro stats`"
        )
    return ({"test": split["test"]} if split["test"] else {}) | {"validation": split["val"]}


def constant_images(samples: Samples, stats: dict[str, Any], camera: int = 0) -> torch.Tensor:
    """Camera `camera`'s training frames' mean colour in place of its every frame, as a broadcast view."""
    image_stats = stats["image"][layout.camera_rgb(camera)]
    grey = torch.tensor([round(255 * m) for m in image_stats["mean"]], dtype=torch.uint8)
    return grey.expand_as(samples.batch[image_key(camera)])


def image_key(camera: int) -> str:
    return "obs_images" if camera == 0 else f"obs_images_camera{camera}"


def camera_ablations(
    samples: Samples, stats: dict[str, Any], seed: int
) -> dict[str, dict[str, torch.Tensor]]:
    """{ablation name: the batch's entries it replaces}, per camera: its frames from a sample of
    another episode (with that sample's validity, for camera k >= 1), a constant image, and for
    camera k >= 1 absent (every step masked: the policy's learned absent embedding). Camera 0's
    keep the names of a one-camera policy's ablations."""
    cameras = [0] + sorted(
        int(k.removeprefix("obs_images_camera")) for k in samples.batch if k.startswith("obs_images_camera")
    )
    partners = (
        torch.from_numpy(foreign_episode_partners(samples.episodes, seed))
        if len(set(samples.episodes.tolist())) >= 2
        else None
    )
    out: dict[str, dict[str, torch.Tensor]] = {}
    for k in cameras:
        suffix = "" if k == 0 else f"_camera{k}"
        images, valid = image_key(k), f"obs_valid_camera{k}"
        if partners is not None:
            out[ABLATION_OTHER_EPISODES + suffix] = {images: samples.batch[images][partners]} | (
                {valid: samples.batch[valid][partners]} if k else {}
            )
        out[ABLATION_CONSTANT_IMAGE + suffix] = {images: constant_images(samples, stats, k)}
        if k:
            out[ABLATION_ABSENT + suffix] = {valid: torch.zeros_like(samples.batch[valid])}
    return out


def evaluate(
    policy: DiffusionPolicy, store: Path, stats: dict[str, Any], config: EvalConfig
) -> dict[str, Any]:
    """The report of every held-out side (`held_out_sides`), the headline's first; the headline's
    per-step errors, samples and chunks (for the plots); the baselines' seconds."""
    pc = policy.config
    window = WindowConfig(pc.n_obs_steps, pc.horizon, pc.n_action_steps)
    baselines = Baselines.build(store, stats, window, config)
    result = over_sides(
        stats,
        lambda episodes: evaluate_side(policy, store, episodes, stats, baselines, config),
        baselines.nearest_neighbour.build_s,
    )
    # What the image features know of the next grasp and release, on the headline side's frames.
    headline = held_out_sides(stats)[result["report"]["headline"]]
    result["report"]["encoder_probe"] = encoder_probe(policy, store, stats, headline)
    return result


def over_sides(
    stats: dict[str, Any], evaluate_one: Callable[[list[int]], dict[str, Any]], nn_build_s: float
) -> dict[str, Any]:
    """`evaluate_one(episodes)` on every held-out side, the headline first: the report of each (and
    why there is no test side), the headline's per-step errors, samples and chunks, the nearest
    neighbour's seconds."""
    sides = held_out_sides(stats)
    report: dict[str, Any] = {"headline": next(iter(sides))}
    if "test" not in sides:
        report["no_test_side"] = (
            "stats.test_fraction is 0: the headline is validation, the side the settings were chosen on, "
            "so its numbers are optimistic"
        )
    results, search_s = {}, 0.0
    for side, episodes in sides.items():
        results[side] = evaluate_one(episodes)
        report[side] = results[side]["report"]
        search_s += results[side]["search_s"]
    headline = results[report["headline"]]
    return {
        "report": report,
        "per_step": headline["per_step"],
        "samples": headline["samples"],
        "chunks": headline["chunks"],
        # Seconds differ from run to run: kept out of the report, whose bytes depend on the inputs only.
        "baseline_cost_s": {"nearest_neighbour": {"build_s": nn_build_s, "predict_s": search_s}},
    }


def evaluate_side(
    policy: DiffusionPolicy,
    store: Path,
    episodes: list[int],
    stats: dict[str, Any],
    baselines: Baselines,
    config: EvalConfig,
) -> dict[str, Any]:
    """One held-out side: the policy, the baselines and the ablations on its samples.

    With several grippers, the report's numbers are over the grippers as a whole (each error the
    mean of the grippers'), and `per_gripper` holds the same report for each gripper alone."""
    pc = policy.config
    samples = collect_samples(store, episodes, baselines.window, config.stride, pc.remember_release)
    recorded = samples.batch["action"].double().numpy()
    log.info("evaluating on %d samples of %d held-out episodes", len(samples), len(episodes))

    chunks, baseline_names, omitted, search_s = side_chunks(policy, samples, baselines, stats, config)
    spread = _spread(policy, samples, config)

    def side_report(errors: dict[str, dict[str, np.ndarray]], recorded: np.ndarray, spread_mm: float):
        return _side_report(errors, recorded, samples, baseline_names, spread_mm, pc.n_action_steps, config)

    report, per_step = side_report(
        {name: whole_errors(chunk, recorded) for name, chunk in chunks.items()},
        recorded,
        float(np.mean(spread)),
    )
    if pc.grippers > 1:
        report["per_gripper"] = {}
        for g, recorded_g in enumerate(gripper_chunks(recorded)):
            errors = {
                name: chunk_errors(gripper_chunks(chunk)[g], recorded_g) for name, chunk in chunks.items()
            }
            report["per_gripper"][f"robot{g}"], _ = side_report(errors, recorded_g, spread[g])
    report["omitted"] = omitted
    report["skipped"] = samples.skipped
    return {
        "report": report,
        "per_step": per_step,
        "samples": samples,
        "chunks": chunks,
        "search_s": search_s,
    }


def side_chunks(
    policy: DiffusionPolicy, samples: Samples, baselines: Any, stats: dict[str, Any], config: EvalConfig
) -> tuple[dict[str, np.ndarray], list[str], dict[str, str], float]:
    """Every chunk a side is judged by, {name: (N, T, ...)}: the policy's, each baseline's (from
    `baselines.chunks`) and each camera ablation's; the baselines' names; {name: why} of those that
    cannot be made; the nearest neighbour's search seconds."""
    chunks = {"policy": predict(policy, samples.batch, config.batch_size, config.seed)}
    baseline_chunks, search_s = baselines.chunks(samples)
    chunks |= baseline_chunks
    ablations = camera_ablations(samples, stats, config.seed)
    omitted = {}
    if ABLATION_OTHER_EPISODES not in ablations:
        omitted[ABLATION_OTHER_EPISODES] = "needs at least 2 episodes on this side"
    for name, replaced in ablations.items():
        chunks[name] = predict(policy, samples.batch | replaced, config.batch_size, config.seed)
    for name, why in omitted.items():
        log.warning("%s omitted: %s", name, why)
    return chunks, list(baseline_chunks), omitted, search_s


def _side_report(
    errors: dict[str, dict[str, np.ndarray]],
    recorded: np.ndarray,
    samples: Samples,
    baseline_names: list[str],
    spread_mm: float,
    n_action_steps: int,
    config: EvalConfig,
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The report of one side from every chunk's errors {name: {component: (N, T)}} (the policy,
    the baselines, the camera ablations), and its per-step position errors."""
    report, per_step, executed, summary = error_report(
        errors, COMPONENTS, samples, baseline_names, n_action_steps, config
    )
    report["camera_ablation_gap_position_mm"] = ablation_gaps(
        executed, summary, "position_mm", samples, config
    )
    report["moving_vs_still"] = moving_vs_still(
        {name: executed[name] for name in ("policy", *baseline_names)},
        moving_samples(recorded, n_action_steps, config.moving_position_mm, config.moving_width_mm),
        samples.episodes,
        config,
    )
    report["spread_mm"] = spread_mm
    return report, per_step


def error_report(
    errors: dict[str, dict[str, np.ndarray]],
    components: tuple[str, ...],
    samples: Samples,
    baseline_names: list[str],
    n_action_steps: int,
    config: EvalConfig,
) -> tuple[dict[str, Any], list[dict[str, float]], dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """What a side's report holds whatever a chunk is (gripper poses, or joints in
    `joint_space`), from every chunk's errors {name: {component: (N, T)}}: the counts, each chunk's
    summaries, the policy's ratio to each baseline and to the best one (95% CI). Also the per-step
    errors of `components[0]`, each chunk's executed errors per sample, and `seeds_summary`'s
    result (for the camera ablation gaps)."""
    executed = {
        name: {c: e[c][:, :n_action_steps].mean(axis=1) for c in components} for name, e in errors.items()
    }
    report: dict[str, Any] = {
        "samples": len(samples),
        "episodes": len(set(samples.episodes.tolist())),
        "skipped_episodes": len(samples.skipped),
    }
    per_step = []
    for name, errs in errors.items():
        summaries = {c: summarize(errs[c], n_action_steps) for c in components}
        report[name] = {c: {k: v for k, v in s.items() if k != "per_step_mean"} for c, s in summaries.items()}
        for h, value in enumerate(summaries[components[0]]["per_step_mean"]):
            if len(per_step) <= h:
                per_step.append({"step": h + 1})
            per_step[h][name] = value
    for baseline in baseline_names:
        report[f"ratio_to_{baseline}"] = {
            c: report["policy"][c]["executed"]["mean"] / max(report[baseline][c]["executed"]["mean"], 1e-12)
            for c in components
        }
    other = executed.get(ABLATION_OTHER_EPISODES)
    summary = seeds_summary(
        {c: executed["policy"][c][None] for c in components},
        {c: other[c][None] for c in components} if other is not None else None,
        {b: executed[b] for b in baseline_names},
        samples.episodes,
        config.seed,
        config.bootstrap_resamples,
    )
    # Flat enough for `dvc metrics diff`: one number (or name) per key path.
    report["best_baseline"] = {c: summary[c]["best_baseline"] for c in components}
    report["ratio_to_best_baseline"] = {c: summary[c]["ratio_to_best_baseline"]["mean"] for c in components}
    report["ratio_to_best_baseline_ci95"] = {
        c: _low_high(summary[c]["ratio_to_best_baseline"]["ci95"]) for c in components
    }
    report["policy_executed_ci95"] = {c: _low_high(summary[c]["policy"]["ci95"]) for c in components}
    report["ci_method"] = CI_METHOD
    report["ci_covers"] = ci_scope({"policy": 1}, report["episodes"])
    return report, per_step, executed, summary


def ablation_gaps(
    executed: dict[str, dict[str, np.ndarray]],
    summary: dict[str, Any],
    component: str,
    samples: Samples,
    config: EvalConfig,
) -> dict[str, Any]:
    """Each camera ablation's executed `component` error minus the policy's, with a 95% CI: the
    other-episodes gap as `policypipe compare` reports it (`summary`, the same bootstrap); every
    other ablation, which compare leaves out, by a paired bootstrap over the episodes and samples.
    Camera 0's by kind, camera k's under `camera{k}`."""
    gaps: dict[str, Any] = {}
    if ABLATION_OTHER_EPISODES in executed:
        gap = summary[component]["camera_ablation_gap"]
        gaps["other_episodes"] = {"mean": gap["mean"]} | _low_high(gap["ci95"])
    for name in executed:
        ablation = ABLATION_NAME.match(name)  # camera_ablation_absent_camera2: kind absent, camera 2
        if ablation is None or name == ABLATION_OTHER_EPISODES:
            continue
        kind, camera = ablation[1], ablation[2]
        gap = executed[name][component] - executed["policy"][component]
        entry = {"mean": float(gap.mean())} | _low_high(
            bootstrap_mean_ci(gap, samples.episodes, config.seed, config.bootstrap_resamples)
        )
        (gaps.setdefault(f"camera{camera}", {}) if camera else gaps)[kind] = entry
    return gaps


def moving_vs_still(
    executed: dict[str, dict[str, np.ndarray]],
    moving: dict[str, np.ndarray],
    episodes: np.ndarray,
    config: EvalConfig,
) -> dict[str, Any]:
    """Per component of `moving` and for its moving and its still samples: their number and
    episodes, the executed error of the policy and of each baseline, the best baseline and the
    policy's ratio to it with a 95% CI (as the headline). `executed` maps "policy" and each
    baseline to {component: (N,)}."""
    rules = {
        "position_mm": f"moving: the recorded position leaves the current one by more than "
        f"{config.moving_position_mm} mm at some executed step",
        "width_mm": f"moving: the recorded width changes by more than {config.moving_width_mm} mm "
        "from the current one at some executed step",
    }
    baselines = [name for name in executed if name != "policy"]
    out: dict[str, Any] = {}
    for c, is_moving in moving.items():
        out[c] = {"rule": rules[c]}
        for state, mask in (("moving", is_moving), ("still", ~is_moving)):
            entry: dict[str, Any] = {"samples": int(mask.sum()), "episodes": len(np.unique(episodes[mask]))}
            if mask.any():
                summary = seeds_summary(
                    {c: executed["policy"][c][mask][None]},
                    None,
                    {b: {c: executed[b][c][mask]} for b in baselines},
                    episodes[mask],
                    config.seed,
                    config.bootstrap_resamples,
                )[c]
                entry["policy"] = summary["policy"]["mean"]
                entry["baselines"] = {b: v["mean"] for b, v in summary["baselines"].items()}
                if "best_baseline" in summary:
                    ratio = summary["ratio_to_best_baseline"]
                    entry["best_baseline"] = summary["best_baseline"]
                    entry["ratio_to_best_baseline"] = ratio["mean"]
                    entry["ratio_to_best_baseline_ci95"] = _low_high(ratio["ci95"])
            out[c][state] = entry
    return out


def _low_high(ci: tuple[float, float] | list[float]) -> dict[str, float]:
    return {"ci95_low": float(ci[0]), "ci95_high": float(ci[1])}


def _spread(policy: DiffusionPolicy, samples: Samples, config: EvalConfig) -> list[float]:
    """Per gripper, the mean pairwise distance (mm) of several noise samples' executed positions,
    over `spread_observations` observations."""
    picks = np.unique(
        np.linspace(0, len(samples) - 1, min(config.spread_observations, len(samples))).round().astype(int)
    )
    spreads = []
    for i in picks:
        repeated = {
            k: v[i : i + 1].expand(config.spread_samples, *v.shape[1:]).clone()
            for k, v in samples.batch.items()
        }
        draws = predict(policy, repeated, config.spread_samples, config.seed + 1 + int(i))
        spreads.append(
            [
                mean_pairwise_distance_mm(chunk, policy.config.n_action_steps)
                for chunk in gripper_chunks(draws)
            ]
        )
    return [float(np.mean([s[g] for s in spreads])) for g in range(policy.config.grippers)]


def compare_policies(
    side_a: list[DiffusionPolicy],
    side_b: list[DiffusionPolicy] | None,
    store: Path,
    stats: dict[str, Any],
    config: EvalConfig,
    held_out: str = "validation",
) -> dict[str, Any]:
    """Policies on the same samples of one held-out side (`held_out`: "validation", where choices
    are made, or "test"), each side a list of seeds of one configuration.

    Per side and component: the policy's executed error, each baseline's, the ratio to the best
    baseline and the in-distribution camera ablation gap; with B, the difference B - A. Every
    value has a 95% CI from a bootstrap over seeds, then episodes, then samples within them (the
    episodes and samples shared by all quantities), so it includes seed-to-seed variation when a
    side has more than one seed.
    """
    if not side_a:
        raise ValueError("side A needs at least one policy")
    sides = {"A": side_a} | ({"B": side_b} if side_b else {})
    policies = [p for side in sides.values() for p in side]
    if any(p.config.joint_space for p in policies):
        raise ValueError(
            "policypipe compare takes gripper-pose policies so far; a joint-space policy is evaluated "
            "against its baselines by the eval stage (docs/evaluation.md, 'Joint-space policies')"
        )
    if len({(p.config.n_obs_steps, p.config.horizon) for p in policies}) > 1:
        raise ValueError(
            "the policies see different observation windows or horizons: their samples are not comparable"
        )
    for name, side in sides.items():
        if any(asdict(p.config) != asdict(side[0].config) for p in side):
            raise ValueError(
                f"the policies of side {name} have different configurations; "
                "the seeds of one side must share one configuration"
            )
    first = policies[0].config
    window = WindowConfig(first.n_obs_steps, first.horizon, min(p.config.n_action_steps for p in policies))
    held_out_episodes = held_out_sides(stats)
    if held_out not in held_out_episodes:
        raise ValueError(
            f"no {held_out} side: the statistics hold none (stats.test_fraction is 0)"
            if held_out == "test"
            else f"held_out must be 'validation' or 'test', got {held_out!r}"
        )
    # Every side's samples: with their episodes' first frames if any policy remembers its start.
    remembers = any(p.config.remember_release for p in policies)
    samples = collect_samples(store, held_out_episodes[held_out], window, config.stride, remembers)
    recorded = samples.batch["action"].double().numpy()
    baselines, _ = Baselines.build(store, stats, window, config).chunks(samples)
    omitted = {}
    baseline_errors = {
        b: executed_errors(chunk, recorded, window.n_action_steps) for b, chunk in baselines.items()
    }
    other = camera_ablations(samples, stats, config.seed).get(ABLATION_OTHER_EPISODES)  # camera 0's
    if other is None:
        omitted[ABLATION_OTHER_EPISODES] = "needs at least 2 episodes on this side"

    def stacked(
        side: list[DiffusionPolicy], replaced: dict[str, torch.Tensor] | None
    ) -> dict[str, np.ndarray]:
        batch = samples.batch | (replaced or {})
        per_seed = [
            executed_errors(
                predict(p, batch, config.batch_size, config.seed), recorded, window.n_action_steps
            )
            for p in side
        ]
        return {c: np.stack([e[c] for e in per_seed]) for c in COMPONENTS}  # (S, N)

    result: dict[str, Any] = {
        "held_out": held_out,
        "samples": len(samples),
        "episodes": len(set(samples.episodes.tolist())),
        "skipped_episodes": len(samples.skipped),
        "n_action_steps": window.n_action_steps,
        "bootstrap_resamples": config.bootstrap_resamples,
        "ci_method": CI_METHOD,
        "omitted": omitted,
        "sides": {},
    }
    errors = {}
    for name, side in sides.items():
        errors[name] = stacked(side, None)
        ablation = stacked(side, other) if other is not None else None
        result["sides"][name] = {
            "seeds": len(side),
            "ci_covers": ci_scope({name: len(side)}, result["episodes"]),
            "components": seeds_summary(
                errors[name],
                ablation,
                baseline_errors,
                samples.episodes,
                config.seed,
                config.bootstrap_resamples,
            ),
        }
    if "B" in sides:
        result["b_minus_a"] = difference_summary(
            errors["A"], errors["B"], samples.episodes, config.seed, config.bootstrap_resamples
        )
        result["b_minus_a_ci_covers"] = ci_scope(
            {name: len(side) for name, side in sides.items()}, result["episodes"]
        )
    return result


def verdict(component: str, difference: dict[str, Any]) -> str:
    """One line on B - A ({"mean", "ci95"}) of a component."""
    unit = component.split("_")[-1]
    name = component.rsplit("_", 1)[0]
    d, (lo, hi) = difference["mean"], difference["ci95"]
    if lo <= 0 <= hi:
        return f"no clear difference on {name}: B - A = {d:+.2f} {unit}, 95% CI [{lo:+.2f}, {hi:+.2f}]"
    better = "B" if d < 0 else "A"
    return f"{better} is better on {name} by {abs(d):.2f} {unit}, 95% CI of B - A [{lo:+.2f}, {hi:+.2f}]"


def comparison_table(result: dict[str, Any]) -> list[str]:
    """The readable form of `compare_policies`' result: one table per side, then B - A."""
    lines = [
        f"{result['samples']} samples of {result['episodes']} {result['held_out']} episodes, "
        f"error over the first {result['n_action_steps']} (executed) steps; [95% CI], "
        f"{result['bootstrap_resamples']} bootstrap resamples",
        f"  CIs: {result['ci_method']}",
    ]
    lines += [f"  {name} omitted: {why}" for name, why in result["omitted"].items()]
    for name, side in result["sides"].items():
        components = side["components"]
        baselines = list(components[COMPONENTS[0]]["baselines"])
        lines.append(
            f"\n{name}: {side['seeds']} seed{'s' * (side['seeds'] > 1)}; CIs cover {side['ci_covers']}"
        )
        lines.append(
            f"  {'':13s} {'policy':>22s} "
            + " ".join(f"{b:>18s}" for b in baselines)
            + f"  {'ratio to best baseline':>41s}  {'camera ablation gap':>24s}"
        )
        for c in COMPONENTS:
            e = components[c]
            ratio = e.get("ratio_to_best_baseline")
            gap = e.get("camera_ablation_gap")
            lines.append(
                f"  {c:13s} {_fmt(e['policy']):>22s} "
                + " ".join(f"{e['baselines'][b]['mean']:18.2f}" for b in baselines)
                + "  "
                + (f"{_fmt(ratio)} {e['best_baseline']:>17s}" if ratio else "-").rjust(41)
                + "  "
                + (_fmt(gap, "+") if gap else "-").rjust(24)
            )
    if "b_minus_a" in result:
        lines.append(f"\nB - A; CIs cover {result['b_minus_a_ci_covers']}")
        lines += [f"  {c:13s} {verdict(c, result['b_minus_a'][c])}" for c in COMPONENTS]
    return lines


def _fmt(entry: dict[str, Any], sign: str = "") -> str:
    lo, hi = entry["ci95"]
    return f"{entry['mean']:{sign}.2f} [{lo:{sign}.2f}, {hi:{sign}.2f}]"
