"""Would a memory of the episode's first frame place the block better? An offline screen (docs/rollout.md,
"A memory of where the mark was, screened offline").

At the grasp the mark is out of the wrist camera's view in about half of the sample's plans, and a
one-step policy then has only the current frame to find it in. Before building a policy that keeps
its first frame, this asks whether that frame would tell it more. Over the frames of the carry (no
grasp ahead, a release ahead: the block is held), the next release's pose relative to the current
one is predicted from the policy's image features (`evaluation.probe.image_features`) three ways,
by the probe's ridge regression fitted on the training episodes and judged on the test side:

  now     the current frame's features: what the one-step policy has
  memory  the episode's first frame's features -> the release relative to the first frame's pose
          (fitted on the training episodes' first frames), composed exactly with where the first
          frame's pose is now (the recorded poses: odometry a policy has): what a policy that kept
          its first frame could know of the mark
  both    the current and the first frame's features and the first pose relative to the current

    python -m tests.benchmarks.measure_mark_memory POLICY [POLICY ...] --dataset STORE --stats STATS \
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
from scipy.spatial.transform import Rotation

from policypipe.dataset import events, layout
from policypipe.dataset.windows import POSE_DIM, episode_bounds, relative_poses, rot6d, rot6d_to_matrix
from policypipe.evaluation.probe import PROBE_STRIDE, image_features, pose_errors, ridge, ridge_predict
from policypipe.policy.export import load_policy


def carry_rows(root: zarr.Group, valid: np.ndarray, episodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every PROBE_STRIDE-th row of `episodes` in which the block is held (no grasp ahead, a release
    ahead), and the first row of each one's episode."""
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    rows = [np.arange(first[e], last[e] + 1, PROBE_STRIDE) for e in episodes]
    starts = np.concatenate([np.full(len(r), first[e]) for r, e in zip(rows, episodes)])
    rows = np.concatenate(rows)
    held = ~valid[rows, 0] & valid[rows, 1]
    return rows[held], starts[held]


def compose(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """(N, 9): the pose `inner` (given in frame S) in frame C, for `outer` the pose of S in C."""
    rotation = rot6d_to_matrix(outer[:, 3:])
    position = outer[:, :3] + np.einsum("nij,nj->ni", rotation, inner[:, :3])
    return np.concatenate([position, rot6d(rotation @ rot6d_to_matrix(inner[:, 3:]))], axis=1)


def screen(policy_dir: Path, store: Path, stats: dict) -> dict:
    policy = load_policy(policy_dir)
    root = zarr.open_group(store, mode="r")
    labels = events.event_labels(root, stats["events"])
    valid = labels[events.VALID]
    release = labels[events.NEXT_RELEASE][:, :POSE_DIM].astype(np.float64)
    position = root[layout.eef_pos(0)][:].astype(np.float64)
    rotation = Rotation.from_rotvec(root[layout.eef_rot(0)][:]).as_matrix()

    train_rows, train_starts = carry_rows(root, valid, stats["split"]["train"])
    test_rows, test_starts = carry_rows(root, valid, stats["split"]["test"])
    needed = np.unique(np.concatenate([train_rows, test_rows, train_starts, test_starts]))
    features = dict(zip(needed.tolist(), image_features(policy, store, needed)))

    def seen(rows: np.ndarray) -> np.ndarray:
        return np.stack([features[int(r)] for r in rows])

    def first_pose_now(rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        first = relative_poses(
            position[rows], rotation[rows], position[starts][:, None], rotation[starts][:, None]
        )
        return first[:, 0]

    def both(rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return np.concatenate([seen(rows), seen(starts), first_pose_now(rows, starts)], axis=1)

    target = release[test_rows]
    first_frames = np.unique(train_starts)
    from_first = ridge(seen(first_frames), release[first_frames])
    from_both = ridge(both(train_rows, train_starts), release[train_rows])
    predicted = {
        "now": ridge_predict(ridge(seen(train_rows), release[train_rows]), seen(test_rows)),
        "memory": compose(
            first_pose_now(test_rows, test_starts), ridge_predict(from_first, seen(test_starts))
        ),
        "both": ridge_predict(from_both, both(test_rows, test_starts)),
    }
    report = {"policy": str(policy_dir), "carry_frames": {"train": len(train_rows), "test": len(test_rows)}}
    for name, prediction in predicted.items():
        position_mm, rotation_deg = pose_errors(prediction, target)
        report[name] = {
            "position_mm_median": round(float(np.median(position_mm)), 1),
            "position_mm_p75": round(float(np.percentile(position_mm, 75)), 1),
            "rotation_deg_median": round(float(np.median(rotation_deg)), 1),
        }
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
        report = screen(policy_dir, args.dataset, stats)
        print(json.dumps(report))
        with args.out.open("a") as out:
            out.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
