"""Stage `eval`: the exported policy on the held-out episodes (test, then validation), against baselines."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

from common import fail, load_config, setup_logging
from policy_stage import policy_stage_parser, record_policy_inputs, skip_policy_stage

from policypipe.atomic import write_json_atomic
from policypipe.config import ConfigError, require_same_window
from policypipe.evaluation.evaluate import EvalConfig, evaluate, held_out_sides
from policypipe.evaluation.joint_space import evaluate_joint_space
from policypipe.evaluation.plots import write_eval_plots, write_joint_eval_plots
from policypipe.lineage.hashing import sha256_file
from policypipe.lineage.provenance import StageRun
from policypipe.policy.export import is_privileged_control, load_policy, require_trained_with


def main() -> None:
    parser = policy_stage_parser(__doc__)
    parser.add_argument(
        "--per-step", type=Path, required=True, help="plot data: position error per horizon step"
    )
    args = parser.parse_args()
    setup_logging()
    config = load_config("eval", EvalConfig)
    params = {"eval": asdict(config)}

    started = time.monotonic()
    if is_privileged_control(args.policy):
        # Its samples would need the scene's state, which only the synthetic ground truth has: the
        # control is measured where it means something, in closed loop.
        reason = (
            "the policy is the privileged control (train.privileged): it observes the synthetic scene's "
            "state, not the camera; `dvc repro rollout` measures it in closed loop"
        )
        skip_policy_stage("eval", params, reason, args, [args.metrics, args.per_step])
        return
    with StageRun("eval", params=params) as run:
        try:
            policy = load_policy(args.policy)
        except (OSError, ValueError) as exc:
            fail(f"{exc}; rebuild it with `dvc repro train` (or `dvc pull`)")
        stats = json.loads(args.stats.read_text())
        try:
            require_same_window(stats, asdict(policy.config), f"the policy {args.policy}")
            # Other statistics split the episodes otherwise: their held-out sides may hold episodes
            # this policy trained on.
            require_trained_with(args.policy, sha256_file(args.stats), args.stats)
        except (ConfigError, ValueError) as exc:
            fail(str(exc))
        try:
            sides = ", ".join(f"{len(episodes)} {side}" for side, episodes in held_out_sides(stats).items())
            print(f"eval: held-out episodes ({sides}), every {config.stride}th anchor frame ...", flush=True)
            joint_space = policy.config.joint_space
            result = (evaluate_joint_space if joint_space else evaluate)(policy, args.dataset, stats, config)
        except ValueError as exc:
            fail(str(exc))
        side = f"{result['report']['headline']} episodes"
        per_step = result["per_step"]
        write_json_atomic(args.metrics, result["report"])
        write_json_atomic(args.per_step, per_step)
        plot = (
            write_joint_eval_plots
            if joint_space
            else partial(write_eval_plots, episodes=config.plot_episodes)
        )
        plot(
            args.dataset,
            result["samples"],
            result["chunks"],
            per_step,
            args.plots,
            policy.config.n_action_steps,
            side=side,
        )
    # Host-dependent, so here rather than in the metrics, whose bytes depend on the inputs only.
    costs = result["baseline_cost_s"]
    run.details["baseline_cost_s"] = {
        name: {step: round(s, 3) for step, s in cost.items()} for name, cost in costs.items()
    }
    record_policy_inputs(run, args, stats)
    run.add_outputs([args.metrics, args.per_step, args.plots])
    run.write(args.provenance)

    report = result["report"]
    for side in (side for side in ("test", "validation") if side in report):
        label = "headline" if side == report["headline"] else "chose the settings"
        summary = joint_side_summary if joint_space else side_summary
        print(f"{side} ({label}): {summary(report[side])}")
        for gripper, alone in report[side].get("per_gripper", {}).items():  # several grippers: each alone
            print(f"  {gripper}: {side_summary(alone)}")
    if probe := report.get("encoder_probe", {}).get("next_grasp"):
        held_out, train = (probe[side].get("start", probe[side]["all"]) for side in ("held_out", "train"))
        print(
            f"encoder probe, first second of each episode: the next grasp {held_out['position_mm']:.0f} mm "
            f"and {held_out['rotation_deg']:.0f} deg off on the {report['headline']} episodes "
            f"({train['position_mm']:.0f} mm, {train['rotation_deg']:.0f} deg on the training ones)"
        )
    if "no_test_side" in report:
        print(f"note: {report['no_test_side']}")
    print(f"done in {time.monotonic() - started:.0f} s")
    for name, cost in result["baseline_cost_s"].items():
        print(f"{name}: built in {cost['build_s']:.1f} s, predicted in {cost['predict_s']:.1f} s")
    for name, why in report[report["headline"]]["omitted"].items():
        print(f"note: {name} omitted: {why}")


def side_summary(r: dict) -> str:
    """One line of a held-out side's report."""
    p = r["policy"]["position_mm"]["executed"]["mean"]
    best = r["best_baseline"]["position_mm"]
    ratio, ci = r["ratio_to_best_baseline"]["position_mm"], r["ratio_to_best_baseline_ci95"]["position_mm"]
    gap = r["camera_ablation_gap_position_mm"].get("other_episodes")
    camera = (
        f"frames of another episode {gap['mean']:+.1f} mm [{gap['ci95_low']:+.1f}, {gap['ci95_high']:+.1f}]"
        if gap
        else "no ablation with other episodes (one episode)"
    )
    return (
        f"{r['samples']} samples of {r['episodes']} episodes: position error over the executed steps "
        f"{p:.1f} mm, {ratio:.2f} [{ci['ci95_low']:.2f}, {ci['ci95_high']:.2f}] of the best baseline "
        f"({best}, {r[best]['position_mm']['executed']['mean']:.1f} mm); {camera}; "
        f"spread {r['spread_mm']:.1f} mm; "
        f"{r['skipped_episodes']} episodes skipped; CIs cover {r['ci_covers']}"
    )


def joint_side_summary(r: dict) -> str:
    """One line of a joint-space held-out side's report (`evaluation.joint_space`)."""
    c = next(iter(r["components"]))  # the arm joints, when there are any
    best, ratio, ci = (
        r["best_baseline"][c],
        r["ratio_to_best_baseline"][c],
        r["ratio_to_best_baseline_ci95"][c],
    )
    return (
        f"{r['samples']} samples of {r['episodes']} episodes: {c} error over the executed steps "
        f"{r['policy'][c]['executed']['mean']:.4f} (the dataset's units), {ratio:.2f} "
        f"[{ci['ci95_low']:.2f}, {ci['ci95_high']:.2f}] of the best baseline ({best}, "
        f"{r[best][c]['executed']['mean']:.4f}); {r['skipped_episodes']} episodes skipped; "
        f"CIs cover {r['ci_covers']}"
    )


if __name__ == "__main__":
    main()
