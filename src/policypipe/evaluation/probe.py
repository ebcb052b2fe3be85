"""What the policy's image features know of the task: a linear probe on the recordings' own labels.

Offline error can look fine while the encoder has not learnt what the task turns on (docs/rollout.md:
the demo's encoder recovered the block's turn on training episodes and not on new ones). The probe
asks it directly. Each gripper's pose at its next grasp and at its next release, relative to the
current pose (`dataset.events`: read off the recordings' width and pose streams, so any dataset has
them), is regressed on camera 0's features (every camera's for a policy whose event head reads
them all, `events_from_every_camera`; the encoders' output at the centre crop, as inference computes
it) by ridge regression fitted on the training episodes' frames, and judged on the held-out
episodes' frames: the median position error (mm) and rotation error (degrees, the angle of the
rotation between the predicted and the recorded pose). A policy trained with the event loss
(`event_loss_weight`) also has its own head's predictions judged on the same frames.

Reported for every frame with a label (`all`) and for the frames of each episode's first second
(`start`: where the gripper must decide how to approach; the diagnosis's "at the start"), on the
training frames (what the features memorised) and the held-out ones (what they generalise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from policypipe.dataset import events, layout
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.dataset.windows import POSE_DIM, episode_bounds, rot6d_to_matrix
from policypipe.policy.diffusion import DiffusionPolicy

# Every PROBE_STRIDE-th frame of an episode (neighbouring frames are near copies of each other).
PROBE_STRIDE = 4
# Ridge penalty on standardised features, per training frame: small (the probe is linear and has far
# more frames than features), fixed (never tuned on what it reports).
RIDGE = 1e-3
# "start": the frames of each episode's first this many seconds.
START_S = 1.0
BATCH = 256


def rows_of(root: zarr.Group, episodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every PROBE_STRIDE-th row of `episodes`, and whether it is in its episode's first START_S."""
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    rows = np.concatenate([np.arange(first[e], last[e] + 1, PROBE_STRIDE) for e in episodes])
    # The episode clock: data/timestamp is 0 at each episode's first frame (docs/dataset.md).
    return rows, root[layout.TIMESTAMP][:][rows] < START_S


@torch.no_grad()
def image_features(policy: DiffusionPolicy, store: Path, rows: np.ndarray) -> np.ndarray:
    """(N, E) what the event head reads at `rows` (`DiffusionPolicy.event_features`: camera 0's
    features, or every camera's), from the centre crops, as inference computes them."""
    cameras = policy.config.event_cameras
    root = zarr.open_group(store, mode="r")
    readers = [FrameShardReader(store, layout.camera_rgb(k)) for k in range(cameras)]
    # A camera the dataset masks where it had no frame (convert.on_missing_camera: mask).
    every_row = np.ones(root[layout.TIMESTAMP].shape[0], bool)
    valid = [
        root[layout.camera_valid(k)][:] if layout.camera_valid(k) in root else every_row
        for k in range(cameras)
    ]
    was_training = policy.training
    policy.eval()
    out = []
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        batch = {"obs_images": torch.from_numpy(readers[0].read_many(chunk))[:, None]}
        for k in range(1, cameras):
            batch[f"obs_images_camera{k}"] = torch.from_numpy(readers[k].read_many(chunk))[:, None]
            batch[f"obs_valid_camera{k}"] = torch.from_numpy(valid[k][chunk])[:, None]
        out.append(policy.event_features(batch).double().numpy())
    policy.train(was_training)
    return np.concatenate(out)


def ridge(features: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardising mean and scale of the features, and (F + 1, D) weights with the intercept last."""
    mean, scale = features.mean(0), features.std(0) + 1e-8
    x = np.concatenate([(features - mean) / scale, np.ones((len(features), 1))], axis=1)
    penalty = RIDGE * len(x) * np.eye(x.shape[1])
    penalty[-1, -1] = 0.0
    return mean, scale, np.linalg.solve(x.T @ x + penalty, x.T @ targets)


def ridge_predict(fit: tuple[np.ndarray, np.ndarray, np.ndarray], features: np.ndarray) -> np.ndarray:
    """(N, D) the fitted `ridge`'s predictions for (N, F) features."""
    mean, scale, weights = fit
    return np.concatenate([(features - mean) / scale, np.ones((len(features), 1))], axis=1) @ weights


def pose_errors(predicted: np.ndarray, recorded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N,) position error in mm and rotation error in degrees of (N, 9) relative poses."""
    position_mm = 1000 * np.linalg.norm(predicted[:, :3] - recorded[:, :3], axis=1)
    between = np.swapaxes(rot6d_to_matrix(predicted[:, 3:9]), -1, -2) @ rot6d_to_matrix(recorded[:, 3:9])
    cos = np.clip((np.trace(between, axis1=-2, axis2=-1) - 1) / 2, -1.0, 1.0)
    return position_mm, np.degrees(np.arccos(cos))


def _medians(predicted: np.ndarray, recorded: np.ndarray, start: np.ndarray) -> dict[str, Any]:
    position_mm, rotation_deg = pose_errors(predicted, recorded)
    report = {}
    for name, keep in (("all", np.ones(len(start), bool)), ("start", start)):
        if keep.any():
            report[name] = {
                "frames": int(keep.sum()),
                "position_mm": round(float(np.median(position_mm[keep])), 2),
                "rotation_deg": round(float(np.median(rotation_deg[keep])), 2),
            }
    return report


def encoder_probe(
    policy: DiffusionPolicy, store: Path, stats: dict[str, Any], held_out: list[int]
) -> dict[str, Any]:
    """The probe's medians on the training and `held_out` episodes' frames, per label, gripper 0's
    (and the policy's own event head's on the held-out frames, where it has one); or why not."""
    if "events" not in stats or policy.config.privileged or policy.config.joint_space:
        return {"not_run": "no grasp and release labels (a joint-space dataset or the privileged control)"}
    root = zarr.open_group(store, mode="r")
    labels = events.event_labels(root, stats["events"])
    train_rows, train_start = rows_of(root, stats["split"]["train"])
    test_rows, test_start = rows_of(root, held_out)
    train_x, test_x = image_features(policy, store, train_rows), image_features(policy, store, test_rows)
    report: dict[str, Any] = {
        "method": f"ridge ({RIDGE} x frames) on the event head's standardised features (camera 0's, or "
        f"every camera's with events_from_every_camera), every {PROBE_STRIDE}th "
        f"frame; medians; start: each episode's first {START_S} s",
    }
    for column, (name, key) in enumerate(
        (("next_grasp", events.NEXT_GRASP), ("next_release", events.NEXT_RELEASE))
    ):
        valid_train = labels[events.VALID][train_rows, column]
        valid_test = labels[events.VALID][test_rows, column]
        if valid_train.sum() < 2 or not valid_test.any():
            continue
        target = labels[key][:, :POSE_DIM].astype(np.float64)
        fit = ridge(train_x[valid_train], target[train_rows][valid_train])

        entry = {
            "train": _medians(
                ridge_predict(fit, train_x[valid_train]),
                target[train_rows][valid_train],
                train_start[valid_train],
            ),
            "held_out": _medians(
                ridge_predict(fit, test_x[valid_test]), target[test_rows][valid_test], test_start[valid_test]
            ),
        }
        if policy.config.event_labels:
            with torch.no_grad():
                head = policy.predict_events(torch.from_numpy(test_x[valid_test]).float())[:, column, 0]
            entry["event_head_held_out"] = _medians(
                head.double().numpy(), target[test_rows][valid_test], test_start[valid_test]
            )
        report[name] = entry
    return report
