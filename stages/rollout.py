"""Stage `rollout`: the exported policy in closed loop in new scenes of the sample's simulator,
beside references on the same scenes: success rates, failures, a contact sheet and videos."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

from common import fail, load_config, setup_logging
from policy_stage import policy_stage_parser, record_policy_inputs, skip_policy_stage

from policypipe.atomic import write_json_atomic
from policypipe.lineage.provenance import StageRun
from policypipe.monitor.scores import Calibration
from policypipe.policy.export import is_privileged_control
from policypipe.progress import Progress
from policypipe.rollout.monitoring import MONITORS
from policypipe.rollout.references import not_of_the_sample_scene, training_demonstrations
from policypipe.rollout.report import (
    CONTROLLERS,
    RolloutStageConfig,
    contact_sheet,
    record_videos,
    report,
    run_rollouts,
    video_seeds,
)
from policypipe.rollout.turn_response import turn_response
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import RuntimeSpec


def main() -> None:
    # The dataset is the nearest-demonstration reference's; the plots, a contact sheet and videos.
    args = policy_stage_parser(__doc__).parse_args()
    setup_logging()
    config = load_config("rollout", RolloutStageConfig)
    params = {"rollout": asdict(config)}

    started = time.monotonic()
    if reason := not_of_the_sample_scene(args.dataset):
        skip_policy_stage("rollout", params, reason, args, [args.metrics])
        return
    with StageRun("rollout", params=params) as run:
        try:
            spec = RuntimeSpec.read(
                args.policy
            )  # an export without its runtime spec: say so before the workers
        except (OSError, ValueError) as exc:
            fail(f"{exc}; rebuild it with `dvc repro train` (or `dvc pull`)")
        grippers = len(spec.grippers)
        if spec.cameras not in (tuple(range(grippers)), tuple(range(grippers + 1))):
            fail(
                f"{args.policy} drives grippers {list(spec.grippers)} with cameras {list(spec.cameras)}: the "
                "simulator has a wrist camera per gripper (camera i is gripper i's) and, for a rig, a scene "
                f"camera after them (camera {grippers}); roll out a policy of the sample's cameras"
            )
        try:
            stats = json.loads(args.stats.read_text())
            demonstrations = [training_demonstrations(args.dataset, stats, i) for i in spec.grippers]
        except (OSError, ValueError, KeyError) as exc:
            fail(
                f"cannot read the training demonstrations from {args.dataset} and {args.stats}: {exc}; "
                "rebuild them with `dvc repro stats` (or `dvc pull`)"
            )
        workers = config.workers or len(os.sched_getaffinity(0))
        last = config.first_seed + config.episodes - 1
        print(
            f"rollout: {config.episodes} scenes (seeds {config.first_seed}-{last}) "
            f"x {len(CONTROLLERS)} controllers, {workers} workers ...",
            flush=True,
        )
        # Minutes of episodes: a bar on a terminal, a line every 10 s in a log (stderr, never an output).
        with Progress(config.episodes * len(CONTROLLERS), desc="rollout", unit="episode") as bar:
            results = run_rollouts(
                args.policy,
                config,
                workers,
                demonstrations,
                progress=lambda _controller, _result: bar.update(1),
            )
        metrics = report(results, config, Calibration.read(args.policy))
        if config.turn_response_scenes and len(spec.grippers) == 1 and not is_privileged_control(args.policy):
            print(f"rollout: turn response on {config.turn_response_scenes} scenes ...", flush=True)
            scenes = range(config.first_seed, config.first_seed + config.turn_response_scenes)
            metrics["turn_response"] = turn_response(PolicyRunner.load(args.policy, config.seed), scenes)
        write_json_atomic(args.metrics, metrics)
        args.plots.mkdir(parents=True, exist_ok=True)
        contact_sheet(results["policy"], args.plots / "final_frames.png")
        videos = record_videos(args.policy, config, video_seeds(results["policy"], config.videos), args.plots)
    record_policy_inputs(run, args, stats)
    run.add_outputs([args.metrics, args.plots])
    run.write(args.provenance)
    for controller in CONTROLLERS:
        m = metrics[controller]
        ci = m["success_ci95"]
        failures = ", ".join(f"{o} {n}" for o, n in m["outcomes"].items() if n and o != "success")
        print(
            f"{controller}: success {m['success_rate']:.0%} [{ci['ci95_low']:.0%}, {ci['ci95_high']:.0%}] "
            f"of {m['episodes']}, grasped the block in {m['grasp_rate']:.0%}"
            + (f"; {failures}" if failures else "")
        )
    if turn := metrics.get("turn_response"):
        print(
            f"turn response: the policy turns {turn['policy_slope']:+.2f} degrees per degree the block is "
            f"turned, the demonstrator {turn['demonstrator_slope']:+.2f}"
        )
    if monitor := metrics.get("monitor"):
        for name in MONITORS:
            m = monitor[name]
            detected, false, lead = m["detected_failures"], m["false_alarms_successes"], m["lead_time_s"]
            area = m["auroc_failed_vs_successful"]
            print(
                f"monitor {name}: alarmed before {detected['count']} of {detected['of']} failures"
                + (f" (median {lead['median']:.1f} s ahead)" if lead else "")
                + f", in {false['count']} of {false['of']} successes"
                + (f"; AUROC {area:.2f}" if area is not None else "")
            )
    print(f"videos: {', '.join(p.name for p in videos) or 'none'}; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
