"""The privileged control's observation: the scene's state, which an image policy must see for itself.

A control experiment (docs/rollout.md, "The privileged control"): the same Diffusion Policy head,
trained, run and rolled out through the same `train`, `runtime` and `rollout` path, but observing
where the block and the mark are instead of a camera's frames. If such a policy fails in closed
loop, the fault is in the action representation, the chunk execution, the timing or the
simulator, not in seeing. It exists only for the synthetic scene: the state comes from a sample
export's ground truth (`ground_truth.recording_plan`) and, in a rollout, from the simulator; a real
export has no such thing, and nothing reads it from one.

The state at one moment, in the gripper's (tool) frame at that moment, SCENE_STATE_DIM numbers:
  block centre (3) m, the angle a of the block's long side from tool x as (cos 2a, sin 2a) (2: the
  block looks the same turned by half a turn), the place mark's centre on the table (3) m.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.synthetic.ground_truth import recording_plan

if TYPE_CHECKING:
    from policypipe.training.config import TrainConfig

SCENE_STATE_NAMES = (
    "block_x",
    "block_y",
    "block_z",
    "block_cos_2a",
    "block_sin_2a",
    "mark_x",
    "mark_y",
    "mark_z",
)
SCENE_STATE_DIM = len(SCENE_STATE_NAMES)
# A dataset row's pose further than this from the ground truth's at its time: the export is another.
MATCH_TOLERANCE_M = 0.005


def scene_state(
    position: np.ndarray,
    rotation: np.ndarray,
    block_centre: np.ndarray,
    block_yaw: np.ndarray,
    mark_xy: np.ndarray,
) -> np.ndarray:
    """(N, SCENE_STATE_DIM) float64: the block and the mark seen from gripper poses `position` (N, 3)
    and `rotation` (N, 3, 3, world <- tool), the block at `block_centre` (N, 3) with yaw `block_yaw`
    (N,), the mark's centre `mark_xy` (2,) on the table (z = 0)."""
    to_tool = np.swapaxes(np.asarray(rotation, dtype=np.float64), -1, -2)
    block = np.einsum("nij,nj->ni", to_tool, np.asarray(block_centre) - position)
    mark = np.einsum("nij,nj->ni", to_tool, np.array([mark_xy[0], mark_xy[1], 0.0]) - position)
    heading = np.arctan2(rotation[:, 1, 0], rotation[:, 0, 0])  # tool x on the table (`simulator._heading`)
    angle = np.asarray(block_yaw) - heading
    return np.concatenate([block, np.cos(2 * angle)[:, None], np.sin(2 * angle)[:, None], mark], axis=1)


def dataset_scene_state(
    store: Path, *, seed: int, recordings: int, recovery: float, hand: float = 0.0
) -> np.ndarray:
    """(N, SCENE_STATE_DIM) float32, one row per dataset row: the state at the row's frame, from the
    ground truth of the one-gripper sample export of `recordings` recordings with `seed`, `recovery`
    and `hand` (`policypipe sample`'s settings), seen from the row's gripper pose (as the runner sees
    it at a frame). Refuses a dataset that is not of that export."""
    root = zarr.open_group(store, mode="r")
    if layout.is_joint_space(root.attrs) or list(root.attrs[layout.ATTRS_GRIPPERS]) != [0]:
        raise ValueError(
            f"{store}: the privileged scene state is the one-gripper sample scene's; this dataset is "
            "not of a one-gripper sample export"
        )
    timestamp = root[layout.TIMESTAMP][:]
    position = root[layout.EEF_POS][:].astype(np.float64)
    rotation = Rotation.from_rotvec(root[layout.EEF_ROT][:].astype(np.float64)).as_matrix()
    ends = root[layout.EPISODE_ENDS][:]
    out = np.zeros((len(timestamp), SCENE_STATE_DIM), np.float32)
    for record, start, stop in zip(root.attrs[layout.ATTRS_EPISODES], [0, *ends[:-1]], ends):
        stem = record["stem"]
        try:
            plan = recording_plan(stem, seed=seed, recordings=recordings, recovery=recovery, hand=hand)
        except ValueError as exc:
            raise ValueError(f"{store}: episode {record['folder']}/{stem}: {exc}") from None
        t_ns = int(record["start_ns"]) + np.round(timestamp[start:stop] * 1e9).astype(np.int64)
        truth, _ = plan.pose_at(t_ns)
        off = float(np.max(np.linalg.norm(truth - position[start:stop], axis=1)))
        if off > MATCH_TOLERANCE_M:
            raise ValueError(
                f"{store}: episode {record['folder']}/{stem} is not recording {stem} of the sample export "
                f"with seed {seed}, {recordings} recordings, recovery {recovery} and hand {hand} "
                f"(its poses are up to {off * 1000:.1f} mm from that recording's): set the export's "
                "settings it was written with"
            )
        centre, yaw = plan.target_at(t_ns)
        out[start:stop] = scene_state(
            position[start:stop], rotation[start:stop], centre, yaw, plan.scene.place_xy
        )
    return out


def scene_state_statistics(features: np.ndarray, store: Path, episodes: list[int]) -> dict[str, list[float]]:
    """The normalizer's statistics of `features` (N, D) over the rows of `episodes` (the training
    side), as one `lowdim` entry of stats.json (min, max, mean, std per dimension)."""
    ends = zarr.open_group(store, mode="r")[layout.EPISODE_ENDS][:]
    starts = np.concatenate([[0], ends[:-1]])
    rows = np.concatenate([features[starts[e] : ends[e]] for e in episodes]).astype(np.float64)
    return {
        "min": rows.min(axis=0).tolist(),
        "max": rows.max(axis=0).tolist(),
        "mean": rows.mean(axis=0).tolist(),
        "std": rows.std(axis=0).tolist(),
    }


def privileged_training(
    store: Path, stats: dict[str, Any], config: TrainConfig
) -> tuple[TrainConfig, dict[str, Any], dict[str, np.ndarray]]:
    """What `training.loop.train` needs for the privileged control of `config.privileged` (the sample
    export `store` was converted from, by its settings): the config with the policy's
    `scene_state_dim` and without the grasp and release labels (below), the statistics with the
    scene state's entry (over the training side), and the per-row scene state
    (`train(row_features=...)`)."""
    export = config.privileged
    if export is None:
        raise ValueError("train.privileged is null: the policy sees through its cameras")
    features = dataset_scene_state(
        store, seed=export.seed, recordings=export.recordings, recovery=export.recovery, hand=export.hand
    )
    entry = scene_state_statistics(features, store, stats["split"]["train"])
    stats = {**stats, "lowdim": {**stats["lowdim"], "obs.scene_state": entry}}
    # The control reads the scene's state in place of a camera: the grasp and release labels that
    # params.yaml's image recipe teaches its encoder (the event loss, the pretraining, the frozen
    # encoder) have no encoder to teach here, and are off.
    model = replace(
        config.model, scene_state_dim=SCENE_STATE_DIM, event_loss_weight=0.0, event_loss_near_m=0.0
    )
    config = replace(config, encoder_pretrain_steps=0, freeze_encoder=False, model=model)
    return config, stats, {"obs_scene_state": features}
