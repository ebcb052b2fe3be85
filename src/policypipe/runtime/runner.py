"""The runner a robot-side loop calls: observations in, absolute timed targets out.

It does what training did to make a sample (`dataset.windows`), on what a robot has: with t the
latest frame's capture time and f the policy's step rate, observation step j is the frame nearest
t - (n_obs_steps - 1 - j) / f, and the gripper pose and width interpolated there (the same
interpolators as `convert`, never extrapolated); frames are resized and JPEG round-tripped as
`convert` stored them; the pose features are relative to the pose at t. The policy samples a
chunk of relative actions, which the runner composes onto the pose and width at t:
step k is the target at t + (k + 1) / f, position p_t + R_t dp, rotation R_t GramSchmidt(r6),
width w_t + dw clipped to the openings of the training episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from policypipe.dataset.episode import PoseInterpolator, interpolate_width, nearest_sample, resize_frame
from policypipe.dataset.image_codec import decode_jpeg, encode_jpeg
from policypipe.dataset.windows import relative_poses, rot6d_to_matrix
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy
from policypipe.runtime.observation import Observation, ObservationError
from policypipe.runtime.spec import RuntimeSpec

NS = 1_000_000_000


@dataclass(frozen=True)
class ActionChunk:
    """A chunk of absolute targets, each with the time it is meant for."""

    observation_ns: int  # t: the capture time of the latest frame the chunk was computed from
    time_ns: np.ndarray  # (H,) int64 t + (k + 1) / f
    position: np.ndarray  # (H, 3) metres, world frame
    quaternion: np.ndarray  # (H, 4) x, y, z, w, world <- gripper
    width: np.ndarray  # (H,) metres, within the training episodes' openings
    # Which steps to execute: the first n_action_steps, less those already past at `now_ns`.
    execute: np.ndarray  # (H,) bool
    past: np.ndarray  # (H,) bool: time_ns <= now_ns (all False without a now_ns)
    relative: np.ndarray  # (H, 10) the policy's output: relative pose (9) and width change (1)


class PolicyRunner:
    def __init__(self, policy: DiffusionPolicy, spec: RuntimeSpec, seed: int = 0) -> None:
        config = policy.config
        ours = (config.n_obs_steps, config.horizon, config.n_action_steps, tuple(config.image_size))
        theirs = (spec.n_obs_steps, spec.horizon, spec.n_action_steps, tuple(spec.image_size))
        if ours != theirs:
            raise ValueError(
                f"the policy's windows and image size {ours} differ from its runtime spec's {theirs}"
            )
        self.policy = policy.eval()
        self.spec = spec
        self.generator = torch.Generator().manual_seed(seed)
        # Observation step j is this long before t (the last one is t itself).
        self.observation_offsets_ns = np.array(
            [round((spec.n_obs_steps - 1 - j) * NS / spec.frequency_hz) for j in range(spec.n_obs_steps)],
            dtype=np.int64,
        )
        self.action_offsets_ns = np.array(
            [round((k + 1) * NS / spec.frequency_hz) for k in range(spec.horizon)], dtype=np.int64
        )

    @classmethod
    def load(cls, folder: Path, seed: int = 0) -> PolicyRunner:
        """The exported policy in `folder` (`data/policy`), checked against its manifest."""
        spec = RuntimeSpec.read(folder)  # first: an older export lacks it, and says to retrain
        return cls(load_policy(folder), spec, seed)

    def act(
        self,
        observation: Observation,
        now_ns: int | None = None,
        seed: int | None = None,
        episode_start_ns: int | None = None,
    ) -> ActionChunk:
        """The next chunk of targets. `now_ns`, the caller's clock at the call, marks the steps
        already past (a caller that knows its latency passes the time the targets will reach the
        robot); `seed` samples with fresh noise of that seed instead of the runner's sequence;
        `episode_start_ns`, the first frame's capture time of the episode, lets the first calls
        act on less history: observation times before it are clamped to it, as training pads the
        start of an episode."""
        batch, t, (p_t, r_t, w_t) = self.prepare(observation, episode_start_ns)
        generator = self.generator if seed is None else torch.Generator().manual_seed(seed)
        relative = self.policy.predict_action(batch, generator)[0].double().numpy()  # (H, 10)
        return self.compose(relative, t, p_t, r_t, w_t, now_ns)

    def prepare(
        self, observation: Observation, episode_start_ns: int | None = None
    ) -> tuple[dict[str, torch.Tensor], int, tuple]:
        """The policy's input batch of one, t, and the pose (position, rotation matrix) and width at t."""
        spec = self.spec
        t = int(observation.frame_ns[-1])
        wanted = t - self.observation_offsets_ns  # (O,) oldest first
        if episode_start_ns is not None:
            wanted = np.maximum(wanted, min(int(episode_start_ns), t))
        half_period = round(NS / spec.frequency_hz / 2)
        if wanted[0] < observation.frame_ns[0] - half_period:
            raise ObservationError(
                f"observation step 0 needs a frame near t - {self.observation_offsets_ns[0] / 1e6:.1f} ms; "
                f"the oldest frame sent is at t - {(t - observation.frame_ns[0]) / 1e6:.1f} ms: "
                f"send the last {spec.n_obs_steps} camera frames at least"
            )
        chosen = (
            nearest_sample(observation.frame_ns, wanted)
            if len(observation.frame_ns) > 1
            else [0] * len(wanted)
        )
        images = np.stack([self._training_frame(observation.frames[i]) for i in chosen])

        x = (wanted - t) / 1e9  # seconds from t, as float64 offsets near zero (never absolute ns)
        self._require_covered(observation.pose_ns, wanted, "pose")
        self._require_covered(observation.width_ns, wanted, "width")
        pose = PoseInterpolator(
            (observation.pose_ns - t) / 1e9, observation.position, Rotation.from_quat(observation.quaternion)
        )
        pos, rot = pose(x)
        rot = rot.as_matrix()
        width = interpolate_width(x, (observation.width_ns - t) / 1e9, observation.width)
        features = relative_poses(pos[None, -1], rot[None, -1], pos[None], rot[None])  # (1, O, 9)
        batch = {
            "obs_images": torch.from_numpy(images[None]),
            "obs_pose": torch.from_numpy(features).float(),
            "obs_width": torch.from_numpy(width[None, :, None]).float(),
        }
        return batch, t, (pos[-1], rot[-1], float(width[-1]))

    def compose(
        self, relative: np.ndarray, t: int, p_t: np.ndarray, r_t: np.ndarray, w_t: float, now_ns: int | None
    ) -> ActionChunk:
        """Relative actions (H, 10) -> absolute targets at their times."""
        spec = self.spec
        position = p_t + relative[:, :3] @ r_t.T
        rotation = r_t @ rot6d_to_matrix(relative[:, 3:9])
        width = np.clip(w_t + relative[:, 9], *spec.width_range_m)
        time_ns = t + self.action_offsets_ns
        past = time_ns <= now_ns if now_ns is not None else np.zeros(spec.horizon, bool)
        execute = (np.arange(spec.horizon) < spec.n_action_steps) & ~past
        return ActionChunk(
            observation_ns=t,
            time_ns=time_ns,
            position=position,
            quaternion=Rotation.from_matrix(rotation).as_quat(),
            width=width,
            execute=execute,
            past=past,
            relative=relative,
        )

    def _training_frame(self, frame: np.ndarray) -> np.ndarray:
        """A camera frame as `convert` stored it: resized, then through the store's JPEG."""
        resized = resize_frame(frame, self.spec.image_size)
        return decode_jpeg(np.frombuffer(encode_jpeg(resized, self.spec.jpeg_quality), np.uint8))

    @staticmethod
    def _require_covered(times: np.ndarray, wanted: np.ndarray, name: str) -> None:
        """Samples before the oldest and at or after the newest observation time: interpolated,
        never extrapolated, as in training."""
        t = wanted[-1]
        if len(times) < 2 or times[0] > wanted[0]:
            raise ObservationError(
                f"{name} samples start at t - {(t - times[0]) / 1e6:.1f} ms; the window needs them from "
                f"t - {(t - wanted[0]) / 1e6:.1f} ms (history older than sent): send more {name} history"
            )
        if times[-1] < t:
            raise ObservationError(
                f"the latest {name} sample is {(t - times[-1]) / 1e6:.1f} ms before the latest frame: the "
                f"{name} at the frame's capture time is interpolated, never extrapolated; act once a {name} "
                "sample at or after the frame has arrived"
            )
