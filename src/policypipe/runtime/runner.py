"""The runner a robot-side loop calls: observations in, absolute timed targets out.

It does what training did to make a sample (`dataset.windows`), on what a robot has: with t the
latest frame's capture time and f the policy's step rate, observation step j is the frame nearest
t - (n_obs_steps - 1 - j) / f, and the gripper pose and width interpolated there (the same
interpolators as `convert`, never extrapolated); frames are resized and JPEG round-tripped as
`convert` stored them; the pose features are relative to the pose at t (each gripper's to its
own, each other gripper's in its frame: `dataset.windows.gripper_features`). Camera k >= 1 gives
each step its frame nearest camera 0's, absent beyond convert's max_camera_offset_ms, as
`convert` chose them. The policy samples a chunk of relative actions, which the runner composes
onto each gripper's pose and width at t: step k is the target at t + (k + 1) / f, position
p_t + R_t dp, rotation R_t GramSchmidt(r6), width w_t + dw clipped to the openings of the
training episodes; with the spec's `open_deadband_m`, a step whose dw opens by less than it holds
w_t (a chunk's small error in the width does not let a held block fall; docs/runtime.md), unless
the gripper reports that it holds nothing (`GripperState.holding`).

A policy with a memory of its episode's start (`PolicyConfig.remember_release`) also reads the
training frame of camera 0 and each gripper's pose at the first request of each episode, which the
runner keeps: one episode at a time (another `episode_start_ns`, a clock that goes back or
`start_episode` starts the next).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from policypipe.dataset.episode import PoseInterpolator, interpolate_width, nearest_sample, resize_frame
from policypipe.dataset.image_codec import decode_jpeg, encode_jpeg
from policypipe.dataset.windows import gripper_features, relative_poses, rot6d_to_matrix
from policypipe.monitor.scores import Calibration, Monitor
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import load_policy
from policypipe.runtime.chunk import ActionChunk, GripperTargets, held_by_deadband
from policypipe.runtime.observation import CameraFrames, GripperState, Observation, ObservationError
from policypipe.runtime.spec import RuntimeSpec

NS = 1_000_000_000


@dataclass(frozen=True)
class GripperAnchor:
    """A gripper's pose and opening at t, onto which the policy's relative actions are composed."""

    position: np.ndarray  # (3,) metres, world frame
    rotation: np.ndarray  # (3, 3) world <- gripper
    width: float  # metres
    # Whether the gripper reports an object between its fingers at t (`GripperState.holding`);
    # None where it does not say.
    holding: bool | None = None


class FrameRunner:
    """What every runner does with camera frames: it checks the policy against its runtime spec,
    picks each observation step's frame of camera 0 (and of every other camera) as training did, and
    makes training frames of them. `PolicyRunner` (gripper poses) and `JointPolicyRunner` (joint
    space, `runtime.joint_runner`) add the low-dimensional state and what the chunk means."""

    def __init__(self, policy: DiffusionPolicy, spec: RuntimeSpec, seed: int = 0) -> None:
        config = policy.config
        ours = (config.n_obs_steps, config.horizon, config.n_action_steps, tuple(config.image_size))
        theirs = (spec.n_obs_steps, spec.horizon, spec.n_action_steps, tuple(spec.image_size))
        if ours != theirs:
            raise ValueError(
                f"the policy's windows and image size {ours} differ from its runtime spec's {theirs}"
            )
        if (config.grippers, config.cameras, config.joint_names) != (
            len(spec.grippers),
            len(spec.cameras),
            spec.joint_names,
        ):
            raise ValueError(
                f"the policy takes {config.grippers} grippers, {config.cameras} cameras and joints "
                f"{list(config.joint_names)}, its runtime spec names grippers {list(spec.grippers)}, "
                f"cameras {list(spec.cameras)} and joints {list(spec.joint_names)}"
            )
        self.policy = policy.eval()
        self.spec = spec
        self.generator = torch.Generator().manual_seed(seed)
        # Observation step j is this long before t (the last one is t itself).
        self.observation_offsets_ns = np.array(
            [round((spec.n_obs_steps - 1 - j) * NS / spec.frequency_hz) for j in range(spec.n_obs_steps)],
            dtype=np.int64,
        )

    def _camera_batch(
        self, cameras: dict[int, CameraFrames], episode_start_ns: int | None
    ) -> tuple[dict[str, torch.Tensor], int, np.ndarray]:
        """Every camera's frames of the observation steps as the policy's batch of one, t, and the
        steps' times (O,), oldest first."""
        spec = self.spec
        camera = cameras[0]
        t = int(camera.frame_ns[-1])
        wanted = t - self.observation_offsets_ns  # (O,) oldest first
        if episode_start_ns is not None:
            wanted = np.maximum(wanted, min(int(episode_start_ns), t))
        half_period = round(NS / spec.frequency_hz / 2)
        if wanted[0] < camera.frame_ns[0] - half_period:
            raise ObservationError(
                f"observation step 0 needs a frame near t - {self.observation_offsets_ns[0] / 1e6:.1f} ms; "
                f"the oldest frame sent is at t - {(t - camera.frame_ns[0]) / 1e6:.1f} ms: "
                f"send the last {spec.n_obs_steps} camera frames at least"
            )
        chosen = chosen_frames(camera.frame_ns, wanted)
        images = np.stack([self._training_frame(camera.frames[i]) for i in chosen])
        batch = {"obs_images": torch.from_numpy(images[None])}
        chosen_ns = camera.frame_ns[chosen]
        for k in spec.cameras[1:]:
            frames, valid = self._other_camera(cameras.get(k), chosen_ns)
            batch[f"obs_images_camera{k}"] = torch.from_numpy(frames[None])
            batch[f"obs_valid_camera{k}"] = torch.from_numpy(valid[None])
        return batch, t, wanted

    def _other_camera(
        self, camera: CameraFrames | None, chosen_ns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Camera k >= 1 at the chosen camera 0 frames: (O, h, w, 3) its nearest frames as training
        frames, black where absent, and (O,) whether each is within max_camera_offset_ms (all
        absent for a camera not sent, as for a recording without it)."""
        width, height = self.spec.image_size
        frames = np.zeros((len(chosen_ns), height, width, 3), np.uint8)
        if camera is None:
            return frames, np.zeros(len(chosen_ns), bool)
        nearest = chosen_frames(camera.frame_ns, chosen_ns)
        offset = np.abs(camera.frame_ns[nearest] - chosen_ns)
        valid = offset <= round(self.spec.max_camera_offset_ms * 1e6)  # convert's comparison
        for j in np.flatnonzero(valid):
            frames[j] = self._training_frame(camera.frames[nearest[j]])
        return frames, valid

    def _training_frame(self, frame: np.ndarray) -> np.ndarray:
        """A camera frame as `convert` stored it: resized, then through the store's JPEG."""
        resized = resize_frame(frame, self.spec.image_size)
        return decode_jpeg(np.frombuffer(encode_jpeg(resized, self.spec.jpeg_quality), np.uint8))

    @staticmethod
    def _require_covered(times: np.ndarray, wanted: np.ndarray, name: str, least: int = 2) -> None:
        """Samples (at least `least`) before the oldest and at or after the newest observation time:
        interpolated, never extrapolated, as in training."""
        t = wanted[-1]
        if len(times) < least or times[0] > wanted[0]:
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


class PolicyRunner(FrameRunner):
    """A gripper-pose policy's runner (the module's docstring)."""

    def __init__(
        self,
        policy: DiffusionPolicy,
        spec: RuntimeSpec,
        seed: int = 0,
        calibration: Calibration | None = None,
    ) -> None:
        if spec.joint_space:
            raise ValueError(
                f"a joint-space policy ({len(spec.joint_names)} joints): this runner, and the policy server "
                "and the MCAP predictions built on it, drive gripper poses; run it in process with "
                "policypipe.runtime.joint_runner.JointPolicyRunner"
            )
        super().__init__(policy, spec, seed)
        self.action_offsets_ns = np.array(
            [round((k + 1) * NS / spec.frequency_hz) for k in range(spec.horizon)], dtype=np.int64
        )
        # The runtime monitor (`policypipe.monitor`), where the policy folder has a calibration.
        self.monitor = Monitor(calibration, policy.normalize_actions) if calibration is not None else None
        # (episode_start_ns, camera 0's training frame, {gripper: anchor}) at the episode's first
        # request, for a policy that remembers its start, and the latest request's t.
        self._start: tuple[int, torch.Tensor, dict[int, GripperAnchor]] | None = None
        self._latest_t: int | None = None

    @classmethod
    def load(cls, folder: Path, seed: int = 0) -> PolicyRunner:
        """The exported policy in `folder` (`data/policy`), checked against its manifest, with its
        monitor's calibration where it has one."""
        spec = RuntimeSpec.read(folder)  # first: an older export lacks it, and says to retrain
        return cls(load_policy(folder), spec, seed, Calibration.read(folder))

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
        batch, t, anchors = self.prepare(observation, episode_start_ns)
        generator = self.generator if seed is None else torch.Generator().manual_seed(seed)
        with torch.no_grad():
            condition = self.policy.condition(batch)
        relative = self.policy.predict_action(batch, generator, condition)[0].double().numpy()  # (H, 10 G)
        chunk = self.compose(relative, t, anchors, now_ns)
        if self.monitor is None:
            return chunk
        reading = self.monitor.read(condition.numpy(), chunk, episode_start_ns)
        return replace(chunk, monitor=reading)

    def prepare(
        self, observation: Observation, episode_start_ns: int | None = None
    ) -> tuple[dict[str, torch.Tensor], int, dict[int, GripperAnchor]]:
        """The policy's input batch of one, t, and each gripper's pose and width at t."""
        spec = self.spec
        self._require_what_the_policy_takes(observation)
        batch, t, wanted = self._camera_batch(observation.cameras, episode_start_ns)
        x = (wanted - t) / 1e9  # seconds from t, as float64 offsets near zero (never absolute ns)
        sampled = [self._gripper_at(i, observation.grippers[i], wanted, x, t) for i in spec.grippers]
        obs_pose, obs_width, _ = gripper_features(
            [(p[None], r[None], w[None]) for p, r, w in sampled], len(x)
        )
        batch["obs_pose"] = torch.from_numpy(obs_pose).float()  # (1, O, 9 G^2)
        batch["obs_width"] = torch.from_numpy(obs_width).float()  # (1, O, G)
        if self.policy.config.privileged:
            batch["obs_scene_state"] = self._scene_state(observation, wanted)
        anchors = {
            i: GripperAnchor(pos[-1], rot[-1], float(width[-1]), observation.grippers[i].holding_at(t))
            for i, (pos, rot, width) in zip(spec.grippers, sampled)
        }
        if self.policy.config.remember_release:
            batch |= self._episode_start(batch, t, anchors, episode_start_ns)
        return batch, t, anchors

    def start_episode(self) -> None:
        """Forgets the kept episode start: the next request starts a new episode, whatever its
        `episode_start_ns` (for a caller that replays several episodes from one start time)."""
        self._start = self._latest_t = None

    def _episode_start(
        self,
        batch: dict[str, torch.Tensor],
        t: int,
        anchors: dict[int, GripperAnchor],
        episode_start_ns: int | None,
    ) -> dict[str, torch.Tensor]:
        """`start_image` and `start_pose` (`policy.diffusion`): what the episode's first request saw,
        kept from then on, and each gripper's pose then relative to its current one. A new episode
        starts with another `episode_start_ns`, a clock that goes back, or `start_episode`."""
        if episode_start_ns is None:
            raise ObservationError(
                "this policy remembers its episode's start (remember_release): pass episode_start_ns, "
                "the capture time of the episode's first frame, with every request"
            )
        new_episode = self._start is None or self._start[0] != int(episode_start_ns)
        if new_episode or (self._latest_t is not None and t < self._latest_t):
            self._start = (int(episode_start_ns), batch["obs_images"][0, -1].clone(), anchors)
        self._latest_t = t
        _, image, start = self._start
        poses = [
            relative_poses(
                anchors[i].position[None],
                anchors[i].rotation[None],
                start[i].position[None, None],
                start[i].rotation[None, None],
            )[0, 0]
            for i in anchors
        ]
        return {
            "start_image": image[None],
            "start_pose": torch.from_numpy(np.stack(poses)[None]).float(),  # (1, G, 9)
        }

    def _scene_state(self, observation: Observation, wanted: np.ndarray) -> torch.Tensor:
        """(1, O, S) the privileged control's scene state at the frames the steps take, as training
        took each step's row."""
        state, frame_ns = observation.scene_state, observation.frame_ns
        dim = self.policy.config.scene_state_dim
        if state is None or np.shape(state) != (len(frame_ns), dim):
            raise ObservationError(
                f"this policy is the privileged control: it observes the synthetic scene's state ({dim} "
                "numbers at each of camera 0's frames), which only the rollout's simulator has, not camera "
                "frames alone"
            )
        return torch.from_numpy(np.asarray(state)[chosen_frames(frame_ns, wanted)][None]).float()

    def _require_what_the_policy_takes(self, observation: Observation) -> None:
        """Every gripper the policy drives, and no gripper or camera it does not know."""
        spec = self.spec
        missing = [i for i in spec.grippers if i not in observation.grippers]
        if missing:
            raise ObservationError(
                f"the policy drives grippers {list(spec.grippers)}: the observation lacks gripper "
                f"{', '.join(map(str, missing))} (send robot{missing[0]}_pose_ns, "
                f"robot{missing[0]}_position, ...)"
            )
        strangers = [f"gripper {i}" for i in observation.grippers if i not in spec.grippers] + [
            f"camera {k}" for k in observation.cameras if k not in spec.cameras
        ]
        if strangers:
            raise ObservationError(
                f"the observation has {', '.join(strangers)}, which the policy was not trained on (it takes "
                f"grippers {list(spec.grippers)} and cameras {list(spec.cameras)}): leave them out"
            )

    def _gripper_at(
        self, i: int, gripper: GripperState, wanted: np.ndarray, x: np.ndarray, t: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gripper i's positions (O, 3), rotation matrices (O, 3, 3) and widths (O,) at the
        observation times `wanted` (`x`: the same as seconds from t)."""
        what = "" if i == 0 else f"gripper {i}'s "
        self._require_covered(gripper.pose_ns, wanted, f"{what}pose")
        self._require_covered(gripper.width_ns, wanted, f"{what}width")
        pose = PoseInterpolator(
            (gripper.pose_ns - t) / 1e9, gripper.position, Rotation.from_quat(gripper.quaternion)
        )
        pos, rot = pose(x)
        return pos, rot.as_matrix(), interpolate_width(x, (gripper.width_ns - t) / 1e9, gripper.width)

    def compose(
        self, relative: np.ndarray, t: int, anchors: dict[int, GripperAnchor], now_ns: int | None
    ) -> ActionChunk:
        """Relative actions (H, 10 G) -> each gripper's absolute targets at their times."""
        spec = self.spec
        grippers = {}
        for g, (i, anchor) in enumerate(anchors.items()):
            own = relative[:, 10 * g : 10 * (g + 1)]
            rotation = anchor.rotation @ rot6d_to_matrix(own[:, 3:9])
            opening = own[:, 9]
            held = held_by_deadband(opening, spec.open_deadband_m, anchor.holding)
            grippers[i] = GripperTargets(
                position=anchor.position + own[:, :3] @ anchor.rotation.T,
                quaternion=Rotation.from_matrix(rotation).as_quat(),
                width=np.clip(anchor.width + np.where(held, 0.0, opening), *spec.width_ranges_m[g]),
            )
        time_ns = t + self.action_offsets_ns
        past = time_ns <= now_ns if now_ns is not None else np.zeros(spec.horizon, bool)
        execute = (np.arange(spec.horizon) < spec.n_action_steps) & ~past
        return ActionChunk(
            observation_ns=t,
            time_ns=time_ns,
            grippers=grippers,
            execute=execute,
            past=past,
            relative=relative,
        )


def chosen_frames(frame_ns: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """(O,) the index of the frame nearest each observation time, as training picked its rows."""
    return nearest_sample(frame_ns, wanted) if len(frame_ns) > 1 else np.zeros(len(wanted), int)
