"""What a policy's event head sees of the block and the mark on the states it reaches itself, against
the same on the scene's demonstration (docs/rollout.md, "What the policy sees on its own states").

The offline screens (`screen_features.py`) judge the features on the demonstrations' own frames; a
policy acts on the frames of the states it reaches, which no demonstration shows. Here each scene is
run twice: the policy drives, and the scene's demonstration drives with the policy's runner reading
each observation in the shadow (as the rollout's monitor does). At every request, from the frame
the runner acts on, the event head's next grasp (while the gripper reports no block) and next
release (while it reports one) are placed in the world from the gripper's pose and compared on the
table's plane with where the simulator has the block's centre and the mark's: the error that
success depends on (the fingers' margin across the block, the mark's 20 mm radius). Binned by how
far the block or the mark is from the gripper on the table, for the policy's episodes (all, and by
outcome) and the demonstration's. The policy's episodes are the rollout's (the same noise per
scene: `bench_rollout_success` gives the same outcomes).

    python -m tests.benchmarks.screen_closed_loop_sight POLICY --first-seed 1000 --episodes 25 \\
        --out F.json [--rows F.rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from policypipe.atomic import write_json_atomic
from policypipe.rollout.episode import episode_noise_seed, rollout_scene, run_episode
from policypipe.rollout.references import DemonstrationReplay
from policypipe.rollout.report import RolloutStageConfig
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.privileged import SCENE_STATE_NAMES
from policypipe.synthetic.render import camera_in_world, camera_matrix, project
from tests.benchmarks.screen_features import distance_bins  # the offline screens' bins, to compare with

BLOCK = slice(SCENE_STATE_NAMES.index("block_x"), SCENE_STATE_NAMES.index("block_z") + 1)
MARK = slice(SCENE_STATE_NAMES.index("mark_x"), SCENE_STATE_NAMES.index("mark_z") + 1)
ROW_COLUMNS = ["event", "error_mm", "distance_mm", "predicted_distance_mm", "height_mm", "time_s"]
LIFTED_M = 0.1  # the demonstration's first knot this high after the grasp is its lift's top
BLIND_MM = 100  # a carry that begins with the mark placed further off than this does not see it


class SightOf:
    """A controller (the policy's runner itself, or a reference with the runner in the shadow) whose
    every request also records the event head's view against the scene's truth."""

    def __init__(self, controller, runner: PolicyRunner) -> None:
        self.controller, self.runner = controller, runner
        # Per request: event (0 grasp, 1 release), error mm, distance mm, the predicted distance mm,
        # the gripper's height above the table mm, seconds from the episode's start.
        self.rows: list[tuple[int, float, float, float, float, float]] = []
        self.start_ns: int | None = None

    def act(self, observation, now_ns=None, episode_start_ns=None):
        batch, t, anchors = self.runner.prepare(observation, episode_start_ns)
        with torch.no_grad():
            predicted = self.runner.policy.predict_events(self.runner.policy.event_features(batch))
        (frame,) = np.flatnonzero(observation.frame_ns == t)  # the frame the runner acts on
        anchor = anchors[0]
        event = 1 if anchor.holding else 0
        truth = observation.scene_state[frame, MARK if event else BLOCK]  # tool frame, metres
        guess = predicted[0, event, 0, :3].double().numpy()
        # Tool frame -> world directions; the table's plane is the world's xy.
        error = anchor.rotation @ (guess - truth)
        distance, predicted_distance = anchor.rotation @ truth, anchor.rotation @ guess
        self.start_ns = t if self.start_ns is None else self.start_ns
        self.rows.append(
            (
                event,
                *(round(1000 * float(np.hypot(*v[:2])), 1) for v in (error, distance, predicted_distance)),
                round(1000 * float(anchor.position[2]), 1),
                round((t - self.start_ns) / 1e9, 2),
            )
        )
        return self.controller.act(observation, now_ns=now_ns, episode_start_ns=episode_start_ns)


def binned(rows: list[tuple], event: int) -> dict:
    chosen = np.array([row[1:3] for row in rows if row[0] == event]).reshape(-1, 2)
    out = {}
    for label, keep in distance_bins(chosen[:, 1]):
        errors = chosen[keep, 0]
        out[label] = {
            "requests": int(keep.sum()),
            "median_mm": round(float(np.median(errors)), 1) if len(errors) else None,
            "p75_mm": round(float(np.percentile(errors, 75)), 1) if len(errors) else None,
        }
    return out


def mark_in_view(
    seed: int, camera_size: tuple[int, int], lift_heights_m: tuple[float, ...] = ()
) -> dict[str, bool]:
    """Whether the mark's centre is inside the wrist camera's image on the scene's demonstration: at
    its start, at its grasp, and at the top of its lift (where the carry begins); and at the lift's
    top raised or lowered to each of `lift_heights_m` (the hand's pose otherwise the same)."""
    plan = rollout_scene(seed)
    lifted_s = next(
        s for s, z in zip(plan.knot_s, plan.knot_position[:, 2]) if s > plan.attach_s and z > LIFTED_M
    )
    k = camera_matrix(*camera_size)
    mark = np.array([[*plan.scene.place_xy, 0.0]])
    seen = {}
    moments = [("start", 0.0, None), ("grasp", plan.attach_s, None), ("lifted", lifted_s, None)]
    moments += [(f"lifted to {1000 * z:.0f} mm", lifted_s, z) for z in lift_heights_m]
    for name, at_s, height_m in moments:
        position, quaternion = plan.pose_at(np.array([plan.start_ns + int(round(at_s * 1e9))]))
        if height_m is not None:
            position[:, 2] = height_m
        rotation, centre = camera_in_world(position, quaternion)
        (u, v), depth = (a[0] for a in project(mark, rotation[0], centre[0], k))
        seen[name] = bool(depth > 0 and 0 <= u < camera_size[0] and 0 <= v < camera_size[1])
    return seen


def carry(rows: list[tuple]) -> dict | None:
    """One episode's carry (the requests holding the block): the mark's error at its first request
    (over BLIND_MM: the carry began blind to the mark), its median error, and its highest point."""
    held = np.array([row for row in rows if row[0] == 1])
    if len(held) == 0:
        return None
    return {
        "first_mm": float(held[0, 1]),
        "median_mm": round(float(np.median(held[:, 1])), 1),
        "highest_mm": float(held[:, 4].max()),
    }


def carries_by_outcome(episodes: dict) -> dict:
    """Per outcome, over the episodes that held the block: how many began the carry blind to the
    mark, the policy's and in the same scenes the demonstration's; the median over episodes of the
    carry's median error and of its highest point, each's."""
    out: dict[str, dict] = {}
    for episode in episodes.values():
        entry = out.setdefault(
            episode["outcome"], {"episodes": 0, "held": 0, "blind": 0, "blind_demonstration": 0}
        )
        entry["episodes"] += 1
        if episode["policy"] is None:
            continue
        entry["held"] += 1
        entry["blind"] += int(episode["policy"]["first_mm"] > BLIND_MM)
        entry["blind_demonstration"] += int(episode["demonstration"]["first_mm"] > BLIND_MM)
        for who in ("policy", "demonstration"):
            for key in ("median_mm", "highest_mm"):
                entry.setdefault(f"{who}_{key}", []).append(episode[who][key])
    for entry in out.values():
        for key in [k for k in entry if k.endswith("_mm")]:
            entry[key] = round(float(np.median(entry[key])), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", type=Path)
    parser.add_argument("--first-seed", type=int, required=True)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=Path, help="also every request's row, one line per episode (JSONL)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = PolicyRunner.load(args.policy)
    if not runner.policy.config.event_labels:
        raise SystemExit(f"{args.policy}: trained without the event head (train.model.event_loss_weight 0)")
    stage = RolloutStageConfig(episodes=args.episodes, first_seed=args.first_seed, videos=0)
    config = stage.episode_config(runner.spec.frequency_hz, runner.spec.open_deadband_m)
    rows = {"policy": [], "demonstration": []}
    episodes, every_row = {}, []
    by_outcome: dict[str, list] = {"success": [], "failed": []}
    for seed in range(args.first_seed, args.first_seed + args.episodes):
        runner.generator.manual_seed(episode_noise_seed(stage.seed, seed))  # as the rollout stage
        watched = SightOf(runner, runner)
        outcome = run_episode(watched, seed, config).outcome
        rows["policy"] += watched.rows
        by_outcome["success" if outcome == "success" else "failed"] += watched.rows
        shadow = SightOf(DemonstrationReplay(rollout_scene(seed), config.frequency_hz), runner)
        run_episode(shadow, seed, config)
        rows["demonstration"] += shadow.rows
        episodes[seed] = {
            "outcome": outcome,
            "policy": carry(watched.rows),
            "demonstration": carry(shadow.rows),
            "mark_in_view": mark_in_view(seed, config.camera_size),
        }
        every_row.append(
            {"scene": seed, "outcome": outcome, "policy": watched.rows, "demonstration": shadow.rows}
        )
        print(f"scene {seed}: {outcome}", flush=True)
    report = {
        "policy_dir": str(args.policy),
        "scenes": [args.first_seed, args.first_seed + args.episodes - 1],
        "what": "median horizontal error (mm) of the event head's next grasp against the block's "
        "centre (block not held) and next release against the mark (held), binned by how far "
        "the block or mark is from the gripper on the table",
    }
    for name, chosen in (*rows.items(), *(("policy_" + k, v) for k, v in by_outcome.items())):
        report[name] = {"grasp": binned(chosen, 0), "release": binned(chosen, 1)}
    report["carry_by_outcome"] = carries_by_outcome(episodes)
    report["episodes"] = episodes
    write_json_atomic(args.out, report)
    if args.rows:
        with args.rows.open("w") as out:
            out.write(json.dumps({"columns": ROW_COLUMNS}) + "\n")
            out.writelines(json.dumps(line) + "\n" for line in every_row)
    print(json.dumps({k: v for k, v in report.items() if k != "episodes"}, indent=1))


if __name__ == "__main__":
    main()
