"""Offline screens of what a policy's image features know of the task, before a lever is built
(docs/rollout.md: "A memory of where the mark was, screened offline" and "Where the features place
the block near the grasp").

**mark-memory.** At the grasp the mark is out of the wrist camera's view in about half of the
sample's plans, and a one-step policy then has only the current frame to find it in. Before a
policy that keeps its first frame is built, this asks whether that frame would tell it more. Over
the frames of the carry (no grasp ahead, a release ahead: the block is held), the next release's
pose relative to the current one is predicted from the policy's image features
(`evaluation.probe.image_features`) three ways, by the probe's ridge regression fitted on the
training episodes and judged on the test side:

  now     the current frame's features: what the one-step policy has
  memory  the episode's first frame's features -> the release relative to the first frame's pose
          (fitted on the training episodes' first frames), composed exactly with where the first
          frame's pose is now (the recorded poses: odometry a policy has): what a policy that kept
          its first frame could know of the mark
  both    the current and the first frame's features and the first pose relative to the current

**grasp-sight.** The largest share of the failures closes on nothing: the fingers close off the
block. The encoder probe reports the next grasp's pose in the first second, where the block is far;
this asks what the features know of it as the fingers close in. Over every other held-out frame
with a grasp ahead, binned by how far that grasp is from the gripper, the median error of the next
grasp's position and rotation from the policy's own event head and from the probe's ridge
regression on its features (`evaluation.probe`), beside what "the grasp is here" would be off (the
distance itself).

**release-sight.** The same over the carry (the block held, a release ahead), binned by how far
the release is: what the features know of the mark as the block comes down on it.

**memory-use.** For a policy that remembers its start (`train.model.remember_release`): over every
MEMORY_USE_STRIDE-th held-out carry frame, how far its memory places the next release, and how far
the executed chunk's last target moves when the sample's own start (its episode's first frame and
pose) is swapped for a start of another held-out episode: whether the diffusion head reads the memory.

    python -m tests.benchmarks.screen_features mark-memory|grasp-sight|release-sight|memory-use POLICY ... \
        --dataset STORE --stats STATS --out results.jsonl

One line per policy is appended to `--out` as it finishes.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import numpy as np
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import events, layout
from policypipe.dataset.windows import (
    POSE_DIM,
    WindowConfig,
    episode_bounds,
    relative_poses,
    rot6d,
    rot6d_to_matrix,
)
from policypipe.evaluation.evaluate import predict
from policypipe.evaluation.probe import PROBE_STRIDE, image_features, pose_errors, ridge, ridge_predict
from policypipe.evaluation.samples import collect_samples
from policypipe.policy.export import load_policy

# grasp-sight: the distance from the gripper to the next grasp, millimetres, [low, high) per bin;
# every GRASP_SIGHT_STRIDE-th frame (the last 2 cm pass in a few frames).
BINS_MM = ((0, 20), (20, 50), (50, 100), (100, 200), (200, None))
GRASP_SIGHT_STRIDE = 2
# memory-use: every 8th held-out frame (as eval's stride), the starts swapped with this seed.
MEMORY_USE_STRIDE, MEMORY_USE_SEED = 8, 0


def strided_rows(root: zarr.Group, episodes: list[int], stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Every stride-th row of `episodes`, and the first row of each one's episode."""
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    rows = [np.arange(first[e], last[e] + 1, stride) for e in episodes]
    starts = np.concatenate([np.full(len(r), first[e]) for r, e in zip(rows, episodes)])
    return np.concatenate(rows), starts


def on_the_way_to(valid: np.ndarray, rows: np.ndarray, event: int) -> np.ndarray:
    """Which `rows` lead to the next `event`: 0, a grasp ahead; 1, the block held (a release ahead
    and no grasp before it)."""
    return valid[rows, 0] if event == 0 else ~valid[rows, 0] & valid[rows, 1]


def carry_rows(root: zarr.Group, valid: np.ndarray, episodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every PROBE_STRIDE-th row of `episodes` in which the block is held, and the first row of each
    one's episode."""
    rows, starts = strided_rows(root, episodes, PROBE_STRIDE)
    held = on_the_way_to(valid, rows, event=1)
    return rows[held], starts[held]


def compose(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """(N, 9): the pose `inner` (given in frame S) in frame C, for `outer` the pose of S in C."""
    rotation = rot6d_to_matrix(outer[:, 3:])
    position = outer[:, :3] + np.einsum("nij,nj->ni", rotation, inner[:, :3])
    return np.concatenate([position, rot6d(rotation @ rot6d_to_matrix(inner[:, 3:]))], axis=1)


def mark_memory(policy_dir: Path, store: Path, stats: dict) -> dict:
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


def approach_rows(root: zarr.Group, valid: np.ndarray, episodes: list[int], event: int) -> np.ndarray:
    """Every GRASP_SIGHT_STRIDE-th row of `episodes` on the way to the next `event`."""
    rows, _ = strided_rows(root, episodes, GRASP_SIGHT_STRIDE)
    return rows[on_the_way_to(valid, rows, event)]


def distance_bins(distance_mm: np.ndarray):
    """(label, mask) for each of BINS_MM: which of these distances fall in it."""
    for low, high in BINS_MM:
        upper = high if high is not None else np.inf
        yield f"{low}-{high or 'more'} mm", (distance_mm >= low) & (distance_mm < upper)


def event_sight(policy_dir: Path, store: Path, stats: dict, event: int) -> dict:
    """The next grasp's (event 0) or release's (1) pose from the event head and the probe, binned by
    how far it is from the gripper."""
    policy = load_policy(policy_dir)
    if not policy.config.event_labels:
        raise SystemExit(f"{policy_dir}: trained without the event head (train.model.event_loss_weight 0)")
    root = zarr.open_group(store, mode="r")
    labels = events.event_labels(root, stats["events"])
    target = labels[(events.NEXT_GRASP, events.NEXT_RELEASE)[event]][:, :POSE_DIM].astype(np.float64)
    train = approach_rows(root, labels[events.VALID], stats["split"]["train"], event)
    test = approach_rows(root, labels[events.VALID], stats["split"]["test"], event)
    train_x, test_x = image_features(policy, store, train), image_features(policy, store, test)
    probe = ridge_predict(ridge(train_x, target[train]), test_x)
    with torch.no_grad():
        head = policy.predict_events(torch.from_numpy(test_x).float())[:, event, 0].double().numpy()
    errors = {"probe": pose_errors(probe, target[test]), "event_head": pose_errors(head, target[test])}
    distance_mm = 1000 * np.linalg.norm(target[test, :3], axis=1)
    report = {"policy": str(policy_dir), "frames": len(test), "bins": {}}
    for label, keep in distance_bins(distance_mm):
        entry = {"frames": int(keep.sum()), "here_mm": round(float(np.median(distance_mm[keep])), 1)}
        for name, (position_mm, rotation_deg) in errors.items():
            entry[f"{name}_mm"] = round(float(np.median(position_mm[keep])), 1)
            entry[f"{name}_deg"] = round(float(np.median(rotation_deg[keep])), 1)
        report["bins"][label] = entry
    return report


def memory_use(policy_dir: Path, store: Path, stats: dict) -> dict:
    policy = load_policy(policy_dir).eval()
    config = policy.config
    if not config.remember_release:
        raise ValueError(f"policy {policy_dir} does not remember its start (train.model.remember_release)")
    episodes = stats["split"]["test"]
    window = WindowConfig(config.n_obs_steps, config.horizon, config.n_action_steps)
    samples = collect_samples(store, episodes, window, MEMORY_USE_STRIDE, episode_start=True)
    labels = events.event_labels(zarr.open_group(store, mode="r"), stats["events"])
    carry = np.flatnonzero(on_the_way_to(labels[events.VALID], samples.anchors, event=1))
    own = {k: v[carry] for k, v in samples.batch.items() if k != "action"}
    rng = np.random.default_rng(MEMORY_USE_SEED)
    owners = samples.episodes[carry]
    other = np.array([rng.choice(np.flatnonzero(owners != o)) for o in owners])
    swapped = own | {"start_image": own["start_image"][other], "start_pose": own["start_pose"][other]}

    def last_target_mm(batch: dict) -> np.ndarray:  # (N, 3) the executed chunk's last position, mm
        return predict(policy, batch, 64, MEMORY_USE_SEED)[:, config.n_action_steps - 1, :3] * 1000

    def memory_off_mm(batch: dict) -> np.ndarray:
        with torch.no_grad():
            remembered = policy.remembered_release(batch)[:, 0, :3].double().numpy()
        return (
            np.linalg.norm(remembered - labels[events.NEXT_RELEASE][samples.anchors[carry], :3], axis=1)
            * 1000
        )

    target = last_target_mm(own)
    moved = np.linalg.norm(last_target_mm(swapped) - target, axis=1)
    return {
        "policy": str(policy_dir),
        "carry_frames": len(carry),
        "memory_off_mm_median": round(float(np.median(memory_off_mm(own))), 1),
        "another_starts_memory_off_mm_median": round(float(np.median(memory_off_mm(swapped))), 1),
        "last_target_from_now_mm_median": round(float(np.median(np.linalg.norm(target, axis=1))), 1),
        "another_start_moves_it_mm_median": round(float(np.median(moved)), 1),
        "another_start_moves_it_mm_p75": round(float(np.percentile(moved, 75)), 1),
    }


SCREENS = {
    "memory-use": memory_use,
    "mark-memory": mark_memory,
    "grasp-sight": partial(event_sight, event=0),
    "release-sight": partial(event_sight, event=1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("screen", choices=sorted(SCREENS))
    parser.add_argument("policies", nargs="+", type=Path)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    stats = json.loads(args.stats.read_text())
    for policy_dir in args.policies:
        report = {"screen": args.screen, **SCREENS[args.screen](policy_dir, args.dataset, stats)}
        print(json.dumps(report))
        with args.out.open("a") as out:
            out.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
