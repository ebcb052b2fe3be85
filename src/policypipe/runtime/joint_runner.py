"""The runner of a joint-space policy (`dataset.joint`, an ALOHA / RDT source): camera frames and
the arm's recent joint vectors in, absolute commands with their times out.

It makes a sample as training did (`dataset.joint_windows.JointSeries`): with t camera 0's latest frame's
capture time and f the policy's step rate, observation step j is the frame nearest
t - (n_obs_steps - 1 - j) / f (every other camera's frame nearest that one, absent beyond
max_camera_offset_ms), and the joint vector at that time, linearly interpolated between the two
samples around it (a sample's own vector at its time; never extrapolated). The policy samples D
absolute commands per step: step k is the command for t + k / f, clipped per joint to the range of
the training commands (`RuntimeSpec.command_ranges`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy
from policypipe.runtime.observation import (
    CameraFrames,
    ObservationError,
    checked_camera,
    checked_floats,
    checked_times,
)
from policypipe.runtime.runner import NS, FrameRunner, PolicyRunner
from policypipe.runtime.spec import RuntimeSpec

OTHER_CAMERA_FIELD = re.compile(r"^camera([1-9][0-9]*)_(frame_ns|frames)$")


@dataclass(frozen=True)
class JointObservation:
    """Every camera's latest frames (camera 0's `frame_ns`, `frames`; camera k's `camera{k}_...`)
    and the arm's recent joint vectors with their times."""

    cameras: dict[int, CameraFrames]
    joints_ns: np.ndarray  # (P,) int64, increasing, on the frames' clock
    joints: np.ndarray  # (P, D) in the policy's joint order (`RuntimeSpec.joint_names`)

    @classmethod
    def checked(cls, frame_ns, frames, joints_ns, joints, **others) -> JointObservation:
        """The observation with its arrays as the runner uses them, or ObservationError."""
        cameras = {0: {"frame_ns": frame_ns, "frames": frames}}
        for name, value in others.items():
            match = OTHER_CAMERA_FIELD.match(name)
            if match is None:
                raise ObservationError(
                    f"unknown observation field {name[:60]!r}: a joint-space observation is frame_ns, "
                    "frames, joints_ns and joints, and camera{k}_frame_ns, camera{k}_frames for camera k >= 1"
                )
            cameras.setdefault(int(match[1]), {})[match[2]] = value
        for k, parts in cameras.items():
            if missing := [f"camera{k}_{f}" for f in ("frame_ns", "frames") if f not in parts]:
                raise ObservationError(f"camera {k} lacks {', '.join(missing)}: send both its fields")
        joints_ns = checked_times(joints_ns, "joints_ns")
        joints = np.asarray(joints)
        if joints.ndim != 2:
            raise ObservationError(f"joints must be (samples, joints), got shape {joints.shape}")
        return cls(
            cameras={k: checked_camera(k, **cameras[k]) for k in sorted(cameras)},
            joints_ns=joints_ns,
            joints=checked_floats(joints, "joints", (len(joints_ns), joints.shape[1])),
        )


@dataclass(frozen=True)
class JointChunk:
    """A chunk of absolute joint commands, each with the time it is meant for."""

    observation_ns: int  # t: the capture time of the latest frame the chunk was computed from
    time_ns: np.ndarray  # (H,) int64 t + k / f
    joints: np.ndarray  # (H, D) commands, within the training commands' range
    joint_names: tuple[str, ...]
    execute: np.ndarray  # (H,) bool: the first n_action_steps, less those already past at `now_ns`
    past: np.ndarray  # (H,) bool: time_ns <= now_ns (all False without a now_ns)


class JointPolicyRunner(FrameRunner):
    def __init__(self, policy: DiffusionPolicy, spec: RuntimeSpec, seed: int = 0) -> None:
        if not spec.joint_space:
            raise ValueError("a gripper-pose policy: run it with policypipe.runtime.runner.PolicyRunner")
        super().__init__(policy, spec, seed)
        self.command_offsets_ns = np.array(
            [round(k * NS / spec.frequency_hz) for k in range(spec.horizon)], dtype=np.int64
        )
        self.low, self.high = np.asarray(spec.command_ranges, np.float64).T

    @classmethod
    def load(cls, folder: Path, seed: int = 0) -> JointPolicyRunner:
        spec = RuntimeSpec.read(folder)
        return cls(load_policy(folder), spec, seed)

    def act(
        self,
        observation: JointObservation,
        now_ns: int | None = None,
        seed: int | None = None,
        episode_start_ns: int | None = None,
    ) -> JointChunk:
        """The next chunk of commands; `now_ns`, `seed` and `episode_start_ns` as `PolicyRunner.act`."""
        batch, t = self.prepare(observation, episode_start_ns)
        generator = self.generator if seed is None else torch.Generator().manual_seed(seed)
        commands = self.policy.predict_action(batch, generator)[0].double().numpy()  # (H, D)
        time_ns = t + self.command_offsets_ns
        past = time_ns <= now_ns if now_ns is not None else np.zeros(self.spec.horizon, bool)
        return JointChunk(
            observation_ns=t,
            time_ns=time_ns,
            joints=np.clip(commands, self.low, self.high),
            joint_names=self.spec.joint_names,
            execute=(np.arange(self.spec.horizon) < self.spec.n_action_steps) & ~past,
            past=past,
        )

    def prepare(
        self, observation: JointObservation, episode_start_ns: int | None = None
    ) -> tuple[dict[str, torch.Tensor], int]:
        """The policy's input batch of one, and t."""
        spec = self.spec
        if observation.joints.shape[1] != len(spec.joint_names):
            raise ObservationError(
                f"joints has {observation.joints.shape[1]} columns; the policy takes "
                f"{len(spec.joint_names)}: {', '.join(spec.joint_names)}"
            )
        if strangers := [k for k in observation.cameras if k not in spec.cameras]:
            raise ObservationError(
                f"the observation has camera {', '.join(map(str, strangers))}, which the policy was not "
                f"trained on (it takes cameras {list(spec.cameras)}): leave them out"
            )
        batch, t, wanted = self._camera_batch(observation.cameras, episode_start_ns)
        # One sample suffices when every step is clamped onto it (the first frame of an episode).
        self._require_covered(observation.joints_ns, wanted, "joints", least=1)
        x = (wanted - t) / 1e9  # seconds from t: float64 offsets near zero
        at = (observation.joints_ns - t) / 1e9
        state = np.stack(
            [np.interp(x, at, observation.joints[:, d]) for d in range(observation.joints.shape[1])], -1
        )
        batch["obs_state"] = torch.from_numpy(state[None]).float()  # (1, O, D)
        return batch, t


def load_runner(folder: Path, seed: int = 0) -> PolicyRunner | JointPolicyRunner:
    """The runner of the exported policy in `folder`, of the kind its runtime spec names."""
    spec = RuntimeSpec.read(folder)
    runner = JointPolicyRunner if spec.joint_space else PolicyRunner
    return runner(load_policy(folder), spec, seed)
