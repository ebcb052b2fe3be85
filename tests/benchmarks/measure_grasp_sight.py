"""How well a policy's image features place the block as the gripper closes in on it (docs/rollout.md,
"Where the features place the block near the grasp").

Most failed episodes close on nothing: the fingers close off the block. The encoder probe reports
the next grasp's pose in the first second, where the block is far; this asks what the features
know of it when the fingers are about to close. Over every other held-out frame with a grasp ahead,
binned by how far that grasp is from the gripper, the median error of the next grasp's position
and rotation from the policy's own event head and from the probe's ridge regression on its
features (`evaluation.probe`), beside what "the grasp is here" would be off (the distance itself).

    python -m tests.benchmarks.measure_grasp_sight POLICY [POLICY ...] --dataset STORE --stats STATS \
        --out results.jsonl

One line per policy is appended to `--out` as it finishes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import zarr

from policypipe.dataset import events, layout
from policypipe.dataset.windows import POSE_DIM, episode_bounds
from policypipe.evaluation.probe import image_features, pose_errors, ridge, ridge_predict
from policypipe.policy.export import load_policy

# Distance from the gripper to the next grasp, millimetres: [low, high) per bin.
BINS_MM = ((0, 20), (20, 50), (50, 100), (100, 200), (200, None))
STRIDE = 2


def grasp_rows(root: zarr.Group, valid: np.ndarray, episodes: list[int]) -> np.ndarray:
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    rows = np.concatenate([np.arange(first[e], last[e] + 1, STRIDE) for e in episodes])
    return rows[valid[rows, 0]]


def measure(policy_dir: Path, store: Path, stats: dict) -> dict:
    policy = load_policy(policy_dir)
    if not policy.config.event_labels:
        raise SystemExit(f"{policy_dir}: trained without the event head (train.model.event_loss_weight 0)")
    root = zarr.open_group(store, mode="r")
    labels = events.event_labels(root, stats["events"])
    grasp = labels[events.NEXT_GRASP][:, :POSE_DIM].astype(np.float64)
    train = grasp_rows(root, labels[events.VALID], stats["split"]["train"])
    test = grasp_rows(root, labels[events.VALID], stats["split"]["test"])
    train_x, test_x = image_features(policy, store, train), image_features(policy, store, test)
    probe = ridge_predict(ridge(train_x, grasp[train]), test_x)
    with torch.no_grad():
        head = policy.predict_events(torch.from_numpy(test_x).float())[:, 0, 0].double().numpy()
    errors = {"probe": pose_errors(probe, grasp[test]), "event_head": pose_errors(head, grasp[test])}
    distance_mm = 1000 * np.linalg.norm(grasp[test, :3], axis=1)
    report = {"policy": str(policy_dir), "frames": len(test), "bins": {}}
    for low, high in BINS_MM:
        keep = (distance_mm >= low) & (distance_mm < (high if high is not None else np.inf))
        entry = {"frames": int(keep.sum()), "here_mm": round(float(np.median(distance_mm[keep])), 1)}
        for name, (position_mm, rotation_deg) in errors.items():
            entry[f"{name}_mm"] = round(float(np.median(position_mm[keep])), 1)
            entry[f"{name}_deg"] = round(float(np.median(rotation_deg[keep])), 1)
        report["bins"][f"{low}-{high or 'more'} mm"] = entry
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", type=Path)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    stats = json.loads(args.stats.read_text())
    for policy_dir in args.policies:
        report = measure(policy_dir, args.dataset, stats)
        print(json.dumps(report))
        with args.out.open("a") as out:
            out.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
