"""What the policy sees and predicts, sampled on each episode's time axis.

With f the dataset's `frequency_hz` and t an anchor frame's capture time (data/timestamp):

- action step k (k = 0..horizon-1) is the pose and width at t + (k + 1) / f, relative to the
  pose and width at t: the width as the change from the current opening, as the pose is the
  motion from the current pose (holding still is all zeros and identities). Step 0 is one
  period ahead (the identity at t itself is never predicted); the first `n_action_steps` are
  executed. To command a robot: target width = current width + action width.
- observation step j (j = 0..n_obs_steps-1) is the pose and width at t - (n_obs_steps-1-j) / f
  (the last one is t itself), relative to the pose at t; its image is the episode's frame
  nearest that time, and how far that frame is from it is reported (`observation_frames`).

Pose and width are interpolated from the recorded streams (`streams/` in `layout`) exactly as
convert interpolates them at the frames (`dataset.episode.PoseInterpolator` /
`interpolate_width`), never read by frame index: a dropped camera frame does not stretch a
step. Times before an episode's first frame or after its last are clamped to them (edge
padding); windows never cross episodes. An anchor is any frame of an episode whose action window
has at most `n_action_steps - 1` padded steps (`EpisodeStreams.anchors`): the last frames of an
episode, whose futures would be mostly padding, are not trained on.

A pose vector is 9 numbers: position in the anchor's gripper frame (3), and a 6D rotation, the
first two columns of the rotation relative to the anchor's (6). An action is 10 (pose + width
change); an observation is the pose (9) and the width itself (1). With G grippers, each one's
numbers relative to its own anchor pose, side by side, and each other gripper's observed poses in
its anchor frame (`observation_names`): 9 G^2 pose numbers, G widths, 10 G action numbers.
Shapes: `M` anchors, `O` observation steps, `H` action steps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.episode import PoseInterpolator, interpolate_width, nearest_sample

POSE_DIM = 9
ACTION_DIM = 10
# A step within this of an episode's last frame is inside it (float rounding of t + k / f).
TIME_TOLERANCE_S = 1e-6
# Seconds between consecutive episodes on the shared time axis: no interpolation spans it.
EPISODE_GAP_S = 1.0
# Anchors per vectorised pass of `EpisodeStreams.windows`: its temporaries are then ~5 MB each
# (4096 x (O + H) samples) and the allocator reuses them from one pass to the next. Over a
# statistics block of 32,768 anchors they were ~40 MB, above glibc's largest mmap threshold
# (32 MiB): each was mapped afresh and page-faulted in (measured over 200,000 frames: 0.2-0.9 s of
# system time per pass, against 0.1-0.2 s in chunks).
WINDOW_CHUNK = 4096


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
            raise ValueError(
                f"n_action_steps must be in 1..horizon ({self.horizon}), got {self.n_action_steps}"
            )

    def action_offsets(self, frequency_hz: float) -> np.ndarray:
        """(H,) seconds after the anchor of each action step."""
        return (np.arange(self.horizon) + 1) / frequency_hz

    def observation_offsets(self, frequency_hz: float) -> np.ndarray:
        """(O,) seconds after the anchor (<= 0) of each observation step, oldest first."""
        return (np.arange(self.n_obs_steps) - (self.n_obs_steps - 1)) / frequency_hz

    def command_offsets(self, frequency_hz: float) -> np.ndarray:
        """(H,) seconds after the anchor of each step of a joint-space chunk
        (`dataset.joint_windows`): step k is the command recorded at t + k / f, step 0 the one issued
        at the anchor itself."""
        return np.arange(self.horizon) / frequency_hz


def episode_bounds(episode_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) row index of each episode, both inclusive."""
    ends = np.asarray(episode_ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    return starts, ends - 1


def rot6d(matrices: np.ndarray) -> np.ndarray:
    """(..., 3, 3) -> (..., 6): the first two columns, a continuous rotation representation."""
    return np.concatenate([matrices[..., :, 0], matrices[..., :, 1]], axis=-1)


def rot6d_to_matrix(r6: np.ndarray) -> np.ndarray:
    """(..., 6) -> (..., 3, 3), the inverse of `rot6d` for any two columns: Gram-Schmidt on them."""
    a, b = r6[..., :3], r6[..., 3:6]
    c1 = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b - np.sum(c1 * b, axis=-1, keepdims=True) * c1
    c2 = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.stack([c1, c2, np.cross(c1, c2)], axis=-1)


def relative_poses(
    anchor_pos: np.ndarray, anchor_rot: np.ndarray, pos: np.ndarray, rot: np.ndarray
) -> np.ndarray:
    """(M, K, 9): poses `pos` (M, K, 3), `rot` (M, K, 3, 3) in the gripper frame of each anchor
    (`anchor_pos` (M, 3), `anchor_rot` (M, 3, 3), world <- anchor)."""
    m, k = pos.shape[:2]
    to_anchor = np.swapaxes(anchor_rot, -1, -2)  # anchor <- world
    rel_pos = np.einsum("mij,mkj->mki", to_anchor, pos - anchor_pos[:, None])
    # One 3 x 3K product per anchor, with its K rotations side by side, rather than K products of
    # 3 x 3: NumPy hands BLAS one call per product, and the calls, not the arithmetic, were the
    # cost. Each entry is the same three-term sum either way.
    side = np.swapaxes(rot, 1, 2).reshape(m, 3, 3 * k)  # (M, 3, 3K): [R_1 | R_2 | ... | R_K]
    rel_rot = np.swapaxes((to_anchor @ side).reshape(m, 3, k, 3), 1, 2)  # (M, K, 3, 3)
    return np.concatenate([rel_pos, rot6d(rel_rot)], axis=-1)


@dataclass(frozen=True)
class Windows:
    """The windows of M anchors, for G grippers (one: the shapes below with G = 1)."""

    obs_pose: np.ndarray  # (M, O, 9 G^2) each gripper's poses relative to its own anchor pose, then each
    #                       other gripper's relative to it (`observation_names`)
    obs_width: np.ndarray  # (M, O, G) metres
    obs_frames: np.ndarray  # (M, O) int64 frame index (row) of each observation's images
    action: np.ndarray  # (M, H, 10 G) per gripper: relative pose and the width's change from the anchor's

    def lowdim_blocks(self) -> dict[str, np.ndarray]:
        """{statistics entry: (rows, dim)}, as `dataset.stats` gathers them."""
        return {
            "action": self.action.reshape(-1, self.action.shape[-1]),
            # Per horizon step (step-major, horizon x 10): near steps move far less than far ones.
            "action_per_step": self.action.reshape(len(self.action), -1),
            "obs.eef_pose_rel": self.obs_pose.reshape(-1, self.obs_pose.shape[-1]),
            "obs.gripper_width": self.obs_width.reshape(-1, self.obs_width.shape[-1]),
        }

    def observation_arrays(self, i: int) -> dict[str, np.ndarray]:
        """Sample i's low-dimensional observation, under the policy's batch keys."""
        return {"obs_pose": self.obs_pose[i], "obs_width": self.obs_width[i]}


def observation_names(grippers: int) -> list[str]:
    """What the 9 G^2 numbers of an observation's pose are, in order: `robot{i}` gripper i's pose in
    its own anchor frame, then `robot{j}_wrt{i}` gripper j's pose in gripper i's anchor frame (UMI's
    bimanual observation), for i, then j != i."""
    own = [f"robot{i}" for i in range(grippers)]
    cross = [f"robot{j}_wrt{i}" for i in range(grippers) for j in range(grippers) if j != i]
    return own + cross


def gripper_features(
    sampled: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_obs_steps: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A window's numbers from every gripper's poses and widths at its observation times, then its
    action times: per gripper positions (M, K, 3), rotation matrices (M, K, 3, 3) and widths (M, K),
    step n_obs_steps - 1 the anchor. Returns obs_pose (M, O, 9 G^2), obs_width (M, O, G) and action
    (M, K - O, 10 G), as `Windows` holds them (and the runtime computes them from a robot's samples)."""
    o = n_obs_steps
    own, cross, widths, actions = [], [], [], []
    for i, (pos, rot, width) in enumerate(sampled):
        rel = relative_poses(pos[:, o - 1], rot[:, o - 1], pos, rot)
        own.append(rel[:, :o])
        widths.append(width[:, :o, None])
        actions.append(np.concatenate([rel[:, o:], (width[:, o:] - width[:, o - 1 : o])[..., None]], axis=-1))
        for j, (pos_j, rot_j, _) in enumerate(sampled):
            if j != i:  # gripper j in gripper i's anchor frame
                cross.append(relative_poses(pos[:, o - 1], rot[:, o - 1], pos_j[:, :o], rot_j[:, :o]))
    if len(sampled) == 1:  # one gripper: its arrays as they are, no copy
        return own[0], widths[0], actions[0]
    return (
        np.concatenate(own + cross, axis=-1),
        np.concatenate(widths, axis=-1),
        np.concatenate(actions, axis=-1),
    )


@dataclass(frozen=True)
class GripperSamples:
    """One gripper's recorded pose and width samples, on each episode's own clock, with their
    `*_episode_ends` as `meta/episode_ends`."""

    pose_time: np.ndarray
    pose_pos: np.ndarray
    pose_rotvec: np.ndarray
    pose_episode_ends: np.ndarray
    width_time: np.ndarray
    width: np.ndarray
    width_episode_ends: np.ndarray


class _Track:
    """One gripper's samples on the shared time axis, its pose interpolator built once."""

    def __init__(self, samples: GripperSamples, shift: np.ndarray) -> None:
        p_first, p_last = episode_bounds(samples.pose_episode_ends)
        w_first, w_last = episode_bounds(samples.width_episode_ends)
        self.bounds = (p_first, p_last, w_first, w_last)
        self.pose_time = np.asarray(samples.pose_time, np.float64) + np.repeat(shift, p_last - p_first + 1)
        self.width_time = np.asarray(samples.width_time, np.float64) + np.repeat(shift, w_last - w_first + 1)
        self.width = np.ascontiguousarray(samples.width, np.float64).reshape(-1)
        self.samples = samples

    def build(self) -> None:
        # Built once over the whole axis (between episodes it is never asked).
        self.pose = PoseInterpolator(
            self.pose_time,
            np.asarray(self.samples.pose_pos, np.float64),
            Rotation.from_rotvec(self.samples.pose_rotvec),
        )


def episode_shift(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """(E,) what to add to each episode's own clock so that the episodes, each spanning its
    starts[e]..stops[e], follow each other on one axis, `EPISODE_GAP_S` apart."""
    # float64 keeps 0.1 ns resolution on an axis as long as 100 hours of episodes.
    return np.concatenate([[0.0], np.cumsum(stops - starts + EPISODE_GAP_S)[:-1]]) - starts


def require_format(root: zarr.Group) -> None:
    """Refuses a store of another format version than this code reads its windows from."""
    version = root.attrs.get(layout.ATTRS_FORMAT)
    if version != layout.FORMAT_VERSION:
        raise ValueError(
            f"dataset {root.store} has format version {version}, "
            f"this code reads version {layout.FORMAT_VERSION} "
            "(version 3 names the streams by gripper): rebuild it with `dvc repro convert`"
        )


class FrameAxis:
    """A dataset's rows on one time axis: each episode's own clock shifted so that the episodes
    follow each other in order, `EPISODE_GAP_S` apart, and what every window needs from it (the
    anchors, clamped times, the observation steps' frames). Subclasses set `frequency_hz`, `first`,
    `last`, `frame_episode` and `frame_time` (shifted), and say when a chunk's steps fall
    (`chunk_offsets`)."""

    frequency_hz: float
    first: np.ndarray
    last: np.ndarray
    frame_episode: np.ndarray
    frame_time: np.ndarray

    def chunk_offsets(self, window: WindowConfig) -> np.ndarray:
        """(H,) seconds after the anchor of each action step."""
        return window.action_offsets(self.frequency_hz)

    def anchors(self, episodes: list[int], window: WindowConfig) -> tuple[np.ndarray, np.ndarray]:
        """(M,) anchor frame indices of `episodes`, in order, and (M,) the episode of each.

        A frame is an anchor when at most n_action_steps - 1 of its action steps fall after the
        episode's last frame, i.e. when step horizon - n_action_steps is inside the episode.
        """
        if not len(episodes):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        episodes = np.asarray(episodes, dtype=np.int64)
        frames = np.concatenate([np.arange(self.first[e], self.last[e] + 1) for e in episodes])
        owner = np.repeat(episodes, self.last[episodes] - self.first[episodes] + 1)
        reach = self.chunk_offsets(window)[window.horizon - window.n_action_steps]
        keep = self.frame_time[frames] + reach <= self.frame_time[self.last[owner]] + TIME_TOLERANCE_S
        return frames[keep], owner[keep]

    def _clamped(self, anchors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(M, K) times anchor + offset, clamped to the anchor's episode (edge padding)."""
        episode = self.frame_episode[anchors]
        lo, hi = self.frame_time[self.first[episode]], self.frame_time[self.last[episode]]
        return np.clip(self.frame_time[anchors][:, None] + offsets[None], lo[:, None], hi[:, None])

    def observation_frames(self, anchors: np.ndarray, window: WindowConfig) -> tuple[np.ndarray, np.ndarray]:
        """((M, O) frame index nearest each observation time, (M, O) its capture time minus that time)."""
        times = self._clamped(anchors, window.observation_offsets(self.frequency_hz))
        frames = nearest_sample(self.frame_time, times)
        return frames, self.frame_time[frames] - times


class EpisodeStreams(FrameAxis):
    """A dataset's frame times and recorded pose and width samples of every gripper, on one time axis
    (`FrameAxis`): one sorted axis for the whole dataset, on which a chunk of anchors from many
    episodes is interpolated in one vectorised call, and a clamped time of one episode never
    reaches another's samples. Arrays are float64 and held in memory, with the pose
    interpolators built once (~70 MB per hour of recording at 200 Hz and gripper), so one sample
    costs a few binary searches.
    """

    def __init__(
        self,
        frequency_hz: float,
        frame_time: np.ndarray,
        episode_ends: np.ndarray,
        pose_time: np.ndarray,
        pose_pos: np.ndarray,
        pose_rotvec: np.ndarray,
        pose_episode_ends: np.ndarray,
        width_time: np.ndarray,
        width: np.ndarray,
        width_episode_ends: np.ndarray,
        other_grippers: tuple[GripperSamples, ...] = (),
    ) -> None:
        """Gripper 0's samples, then `other_grippers`' (1, 2, ...); times on each episode's own
        clock; `*_episode_ends` as `meta/episode_ends`."""
        if not frequency_hz > 0:
            raise ValueError(f"the dataset's frequency_hz must be positive, got {frequency_hz}")
        self.frequency_hz = float(frequency_hz)
        self.first, self.last = episode_bounds(episode_ends)
        grippers = (
            GripperSamples(
                pose_time, pose_pos, pose_rotvec, pose_episode_ends, width_time, width, width_episode_ends
            ),
            *other_grippers,
        )
        starts, stops = [frame_time[self.first]], [frame_time[self.last]]
        for g in grippers:
            p_first, p_last = episode_bounds(g.pose_episode_ends)
            w_first, w_last = episode_bounds(g.width_episode_ends)
            if not len(self.first) == len(p_first) == len(w_first):
                raise ValueError("the frame, pose and width streams have different episode counts")
            starts += [g.pose_time[p_first], g.width_time[w_first]]
            stops += [g.pose_time[p_last], g.width_time[w_last]]
        starts, stops = np.minimum.reduce(starts), np.maximum.reduce(stops)
        shift = episode_shift(starts, stops)
        self.frame_episode = np.repeat(np.arange(len(shift)), self.last - self.first + 1)
        self.frame_time = np.asarray(frame_time, np.float64) + shift[self.frame_episode]
        self.tracks = [_Track(g, shift) for g in grippers]
        self._check()
        for track in self.tracks:
            track.build()

    @property
    def grippers(self) -> int:
        return len(self.tracks)

    def _check(self) -> None:
        """Every episode's streams cover its frames, in time order: nothing is ever extrapolated."""
        if (np.diff(self.frame_time) < 0).any():
            raise ValueError("frames out of order")
        t0, t1 = self.frame_time[self.first], self.frame_time[self.last]
        for i, track in enumerate(self.tracks):
            whose = "" if i == 0 else f"gripper {i}: "
            if (np.diff(track.pose_time) <= 0).any() or (np.diff(track.width_time) <= 0).any():
                raise ValueError(f"{whose}pose or width samples not strictly increasing in time")
            p_first, p_last, w_first, w_last = track.bounds
            bad = (
                (track.pose_time[p_first] > t0)
                | (track.pose_time[p_last] < t1)
                | (track.width_time[w_first] > t0)
                | (track.width_time[w_last] < t1)
            )
            if bad.any():
                raise ValueError(
                    f"{whose}episodes {np.flatnonzero(bad).tolist()}: the pose or width samples "
                    "do not cover their frames"
                )

    @classmethod
    def from_store(cls, root: zarr.Group) -> EpisodeStreams:
        require_format(root)

        def samples(i: int) -> GripperSamples:
            return GripperSamples(
                pose_time=root[layout.pose_timestamp(i)][:],
                pose_pos=root[layout.pose_pos(i)][:],
                pose_rotvec=root[layout.pose_rot(i)][:],
                pose_episode_ends=root[layout.pose_episode_ends(i)][:],
                width_time=root[layout.width_timestamp(i)][:],
                width=root[layout.width(i)][:],
                width_episode_ends=root[layout.width_episode_ends(i)][:],
            )

        first, *others = (samples(i) for i in root.attrs[layout.ATTRS_GRIPPERS])
        return cls(
            float(root.attrs[layout.ATTRS_FREQUENCY]),
            root[layout.TIMESTAMP][:],
            root[layout.EPISODE_ENDS][:],
            first.pose_time,
            first.pose_pos,
            first.pose_rotvec,
            first.pose_episode_ends,
            first.width_time,
            first.width,
            first.width_episode_ends,
            tuple(others),
        )

    def windows(self, anchors: np.ndarray, window: WindowConfig, chunk: int = WINDOW_CHUNK) -> Windows:
        """The observation and action windows of frames `anchors` (M,), vectorised over `chunk`
        anchors at a time. Every number of a window is computed from that anchor alone, so the
        result is the same, bit for bit, for any chunk and any grouping of the anchors."""
        anchors = np.asarray(anchors, dtype=np.int64)
        if len(anchors) <= chunk:
            return self._windows(anchors, window)
        parts = [self._windows(anchors[i : i + chunk], window) for i in range(0, len(anchors), chunk)]
        return Windows(
            **{f.name: np.concatenate([getattr(w, f.name) for w in parts]) for f in fields(Windows)}
        )

    def _windows(self, anchors: np.ndarray, window: WindowConfig) -> Windows:
        """`windows` in one vectorised pass."""
        offsets = np.concatenate(
            [window.observation_offsets(self.frequency_hz), window.action_offsets(self.frequency_hz)]
        )
        times = self._clamped(anchors, offsets)
        sampled = [self._sample(track, times) for track in self.tracks]  # per gripper (M, O + H, ...)
        obs_pose, obs_width, action = gripper_features(sampled, window.n_obs_steps)
        frames, _ = self.observation_frames(anchors, window)
        return Windows(obs_pose=obs_pose, obs_width=obs_width, obs_frames=frames, action=action)

    def episode_start(self, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What a policy with a memory of its episode's start reads (`PolicyConfig.remember_release`):
        (M,) the first frame (row) of each anchor's episode, and (M, G, 9) each gripper's pose at
        that frame relative to its pose at the anchor, as `relative_poses` gives it (the runtime
        computes the same from the pose it kept at the episode's first frame)."""
        anchors = np.asarray(anchors, dtype=np.int64)
        first = self.first[self.frame_episode[anchors]]
        times = np.stack([self.frame_time[anchors], self.frame_time[first]], axis=1)  # (M, 2)
        poses = []
        for track in self.tracks:
            pos, rot, _ = self._sample(track, times)
            poses.append(relative_poses(pos[:, 0], rot[:, 0], pos[:, 1:], rot[:, 1:])[:, 0])
        return first, np.stack(poses, axis=1)

    @staticmethod
    def _sample(track: _Track, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One gripper's pose and width at shared-axis `times` (M, K): positions (M, K, 3), rotation
        matrices (M, K, 3, 3), widths (M, K)."""
        flat = times.ravel()
        pos, rot = track.pose(flat)
        width = interpolate_width(flat, track.width_time, track.width)
        return (
            pos.reshape(*times.shape, 3),
            rot.as_matrix().reshape(*times.shape, 3, 3),
            width.reshape(times.shape),
        )
