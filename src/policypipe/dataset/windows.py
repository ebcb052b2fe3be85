"""What the policy sees and predicts, computed from the dataset's arrays.

Observations are the last `n_obs_steps` frames; actions are the next `horizon` steps. Both
are gripper poses relative to the current pose (position in the current gripper frame, and a
6D rotation: the first two columns of the relative rotation matrix) plus the gripper width.
Windows never cross episodes: indices are clipped to the episode's first and last frame
(edge padding), the same rule training samples with.

Shapes: `P` anchor frames, `T` steps in a window; a pose vector is 9 numbers (3 + 6), an
action 10 (pose + width).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

POSE_DIM = 9
ACTION_DIM = 10


@dataclass(frozen=True)
class WindowConfig:
    """The shared `policy` section of params.yaml: what one training sample spans."""

    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8

    def __post_init__(self) -> None:
        if self.n_obs_steps < 1:
            raise ValueError(f"n_obs_steps must be >= 1, got {self.n_obs_steps}")
        if not 1 <= self.n_action_steps <= self.horizon:
            raise ValueError(f"n_action_steps must be in 1..horizon ({self.horizon}), got {self.n_action_steps}")


def episode_bounds(episode_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) frame index of each episode, both inclusive."""
    ends = np.asarray(episode_ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    return starts, ends - 1


def window_indices(anchors: np.ndarray, first: np.ndarray, last: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(P, T) frame indices anchor + offset, clipped to each anchor's episode [first, last]."""
    return np.clip(anchors[:, None] + offsets[None, :], first[:, None], last[:, None])


def rot6d(matrices: np.ndarray) -> np.ndarray:
    """(..., 3, 3) -> (..., 6): the first two columns, a continuous rotation representation."""
    return np.concatenate([matrices[..., :, 0], matrices[..., :, 1]], axis=-1)


def relative_poses(pos: np.ndarray, rotvec: np.ndarray, anchors: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(P, T, 9): the poses at `indices` expressed in the gripper frame at each anchor."""
    r_anchor = Rotation.from_rotvec(rotvec[anchors]).as_matrix()  # (P, 3, 3), world <- anchor
    r_other = Rotation.from_rotvec(rotvec[indices.ravel()]).as_matrix().reshape(*indices.shape, 3, 3)
    r_anchor_t = np.swapaxes(r_anchor, -1, -2)[:, None]  # anchor <- world
    rel_pos = np.einsum("ptij,ptj->pti", r_anchor_t.repeat(indices.shape[1], axis=1), pos[indices] - pos[anchors][:, None])
    rel_rot = r_anchor_t @ r_other
    return np.concatenate([rel_pos, rot6d(rel_rot)], axis=-1)


def actions(pos, rotvec, width, anchors, first, last, config: WindowConfig) -> np.ndarray:
    """(P, horizon, 10): future poses relative to the anchor, and the width, edge-padded."""
    idx = window_indices(anchors, first, last, np.arange(config.horizon))
    return np.concatenate([relative_poses(pos, rotvec, anchors, idx), width[idx].reshape(*idx.shape, 1)], axis=-1)


def observations(pos, rotvec, width, anchors, first, last, config: WindowConfig) -> tuple[np.ndarray, np.ndarray]:
    """((P, n_obs, 9) past poses relative to the anchor, (P, n_obs, 1) widths), edge-padded."""
    idx = window_indices(anchors, first, last, np.arange(-config.n_obs_steps + 1, 1))
    return relative_poses(pos, rotvec, anchors, idx), width[idx].reshape(*idx.shape, 1)
