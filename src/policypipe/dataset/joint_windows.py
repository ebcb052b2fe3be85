"""Windows of a joint-space dataset (`layout`'s joint-space keys, made by `dataset.joint`), as
`dataset.windows` makes them of gripper poses.

With f the dataset's rate and t an anchor row's time, both absolute (a joint vector means the same
at every row, so nothing is made relative):
- observation step j is the joint vector at t - (n_obs_steps - 1 - j) / f, its images the frames
  nearest that time, as for gripper poses (`dataset.windows`);
- action step k (k = 0..horizon-1) is the command at t + k / f: step 0 is the command issued at the
  anchor itself (ACT's and LeRobot's chunk of an ALOHA episode starts there), the first
  `n_action_steps` are executed.
Times are clamped to the anchor's episode (edge padding) and anchors are the rows whose step
horizon - n_action_steps is inside it, as for poses. A time on a row (within `TIME_TOLERANCE_S`)
takes that row's vector exactly; between rows (where convert dropped a row whose frame did not
decode) the two neighbours are interpolated linearly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zarr

from policypipe.dataset import layout
from policypipe.dataset.episode import nearest_sample
from policypipe.dataset.windows import (
    TIME_TOLERANCE_S,
    WINDOW_CHUNK,
    EpisodeStreams,
    FrameAxis,
    WindowConfig,
    episode_bounds,
    episode_shift,
    require_format,
)


@dataclass(frozen=True)
class JointWindows:
    """The windows of M anchors of a joint-space dataset (D joints)."""

    obs_state: np.ndarray  # (M, O, D) the joint vectors at the observation steps
    obs_frames: np.ndarray  # (M, O) int64 row of each observation's images
    action: np.ndarray  # (M, H, D) the commands at the action steps

    def lowdim_blocks(self) -> dict[str, np.ndarray]:
        """{statistics entry: (rows, dim)}, as `dataset.stats` gathers them."""
        return {
            "action": self.action.reshape(-1, self.action.shape[-1]),
            "action_per_step": self.action.reshape(len(self.action), -1),  # step-major, H x D
            "obs.joint_state": self.obs_state.reshape(-1, self.obs_state.shape[-1]),
        }

    def observation_arrays(self, i: int) -> dict[str, np.ndarray]:
        """Sample i's low-dimensional observation, under the policy's batch key."""
        return {"obs_state": self.obs_state[i]}


class JointSeries(FrameAxis):
    """A joint-space dataset's rows, joint vectors and commands, on one time axis (`FrameAxis`),
    held in memory as float64 (14 joints at 50 Hz: ~8 MB per hour of episodes)."""

    def __init__(
        self,
        frequency_hz: float,
        frame_time: np.ndarray,
        episode_ends: np.ndarray,
        state: np.ndarray,
        action: np.ndarray,
        joint_names: tuple[str, ...],
    ) -> None:
        if not frequency_hz > 0:
            raise ValueError(f"the dataset's frequency_hz must be positive, got {frequency_hz}")
        if state.shape != action.shape or state.shape[1:] != (len(joint_names),):
            raise ValueError(
                f"joint_state {state.shape} and joint_action {action.shape} must both be "
                f"(rows, {len(joint_names)}), one column per joint name"
            )
        self.frequency_hz = float(frequency_hz)
        self.joint_names = tuple(joint_names)
        self.first, self.last = episode_bounds(episode_ends)
        shift = episode_shift(frame_time[self.first], frame_time[self.last])
        self.frame_episode = np.repeat(np.arange(len(shift)), self.last - self.first + 1)
        self.frame_time = np.asarray(frame_time, np.float64) + shift[self.frame_episode]
        if (np.diff(self.frame_time) <= 0).any():
            raise ValueError("rows not strictly increasing in time")
        self.state = np.asarray(state, np.float64)
        self.action = np.asarray(action, np.float64)

    @classmethod
    def from_store(cls, root: zarr.Group) -> JointSeries:
        require_format(root)
        return cls(
            float(root.attrs[layout.ATTRS_FREQUENCY]),
            root[layout.TIMESTAMP][:],
            root[layout.EPISODE_ENDS][:],
            root[layout.JOINT_STATE][:],
            root[layout.JOINT_ACTION][:],
            tuple(root.attrs[layout.ATTRS_JOINT_NAMES]),
        )

    @property
    def gripper_dims(self) -> list[int]:
        """Which of the D dimensions are grippers (`gripper_joints`)."""
        grippers = set(layout.gripper_joints(self.joint_names))
        return [d for d, name in enumerate(self.joint_names) if name in grippers]

    def chunk_offsets(self, window: WindowConfig) -> np.ndarray:
        return window.command_offsets(self.frequency_hz)

    def windows(self, anchors: np.ndarray, window: WindowConfig, chunk: int = WINDOW_CHUNK) -> JointWindows:
        """The observation and action windows of rows `anchors` (M,); each anchor's numbers from its
        own rows alone, so any grouping gives the same result."""
        anchors = np.asarray(anchors, dtype=np.int64)
        parts = [self._windows(anchors[i : i + chunk], window) for i in range(0, max(len(anchors), 1), chunk)]
        return JointWindows(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in JointWindows.__dataclass_fields__)
        )

    def _windows(self, anchors: np.ndarray, window: WindowConfig) -> JointWindows:
        o = window.n_obs_steps
        times = self._clamped(
            anchors,
            np.concatenate([window.observation_offsets(self.frequency_hz), self.chunk_offsets(window)]),
        )
        frames, _ = self.observation_frames(anchors, window)
        return JointWindows(
            obs_state=self._at(self.state, times[:, :o]),
            obs_frames=frames,
            action=self._at(self.action, times[:, o:]),
        )

    def _at(self, values: np.ndarray, times: np.ndarray) -> np.ndarray:
        """(M, K, D) `values` at shared-axis `times` (M, K), inside their episodes: a row's own vector
        at its time, the linear interpolation of the two rows around a time between them."""
        flat = times.ravel()
        t = self.frame_time
        near = nearest_sample(t, flat)
        below = np.clip(np.searchsorted(t, flat, side="right") - 1, 0, len(t) - 1)
        above = np.minimum(below + 1, len(t) - 1)
        span = t[above] - t[below]
        weight = np.where(span > 0, (flat - t[below]) / np.where(span > 0, span, 1.0), 0.0)[:, None]
        between = values[below] + weight * (values[above] - values[below])
        on_row = (np.abs(t[near] - flat) <= TIME_TOLERANCE_S)[:, None]
        return np.where(on_row, values[near], between).reshape(*times.shape, values.shape[1])


def open_series(root: zarr.Group) -> EpisodeStreams | JointSeries:
    """The dataset's windows source: gripper poses (`dataset.windows`) or joint vectors."""
    return (
        JointSeries.from_store(root) if layout.is_joint_space(root.attrs) else EpisodeStreams.from_store(root)
    )
