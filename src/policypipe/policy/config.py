"""The policy's configuration: every size is a param (`train.policy` in params.yaml)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from policypipe.dataset.events import WITHOUT_THE_LABELS
from policypipe.dataset.windows import ACTION_DIM, POSE_DIM

PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")
BETA_SCHEDULES = ("squaredcos_cap_v2", "linear")
NORMALIZATIONS = ("min_max", "mean_std")
TIMESTEP_SPACINGS = ("trailing", "leading")
WIDTH_ACTIONS = ("relative", "absolute")


def unet_horizon_multiple(down_dims: tuple[int, ...]) -> int:
    """What the horizon must be a multiple of: the U-Net halves it once per level after the first
    (a stride-2 convolution), and the way up must meet the skip connections at the same length."""
    return 2 ** (len(down_dims) - 1)


def encoder_feature_map_size(
    crop_size: tuple[int, int], encoder_widths: tuple[int, ...], stem_pool: bool = True
) -> tuple[int, int]:
    """(width, height) of the image encoder's last feature map: the stem's convolution, its max-pool
    (where stem_pool) and every stage after the first each halve it, rounding up (kernel 7/3,
    padding 3/1)."""
    halvings = 1 + int(stem_pool) + len(encoder_widths) - 1
    return tuple(-(-c // 2**halvings) for c in crop_size)  # type: ignore[return-value]


@dataclass(frozen=True)
class PolicyConfig:
    # What one sample spans (the shared `policy` section).
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8
    # What the dataset holds (set from its statistics, not a param): its grippers and cameras, or
    # for a joint-space dataset (`dataset.joint`) its joints, by name, and no gripper poses.
    grippers: int = 1
    cameras: int = 1
    joint_names: tuple[str, ...] = ()
    # The privileged control (`synthetic.privileged`, docs/rollout.md): this many numbers of the
    # synthetic scene's state per observation step in place of every camera's features (no image
    # encoder). 0, every real policy: it sees through its cameras.
    scene_state_dim: int = 0
    # One image encoder per camera (the default: each camera's view is its own), or one shared by all.
    shared_camera_encoder: bool = False
    # Image encoder: a ResNet-18-style CNN with GroupNorm, trained from scratch.
    image_size: tuple[int, int] = (96, 96)  # (width, height) of the dataset frames
    crop_size: tuple[int, int] = (88, 88)  # random crop in training, centre crop at inference
    encoder_widths: tuple[int, ...] = (64, 128, 256, 512)
    # The stem's max-pool, as ResNet-18's. Without it the last feature map is twice as fine in each
    # direction (a 56x56 crop and four stages: 4x4 instead of 2x2), for the keypoints to say where
    # the block is, at about four times the stages' arithmetic (docs/rollout.md, "A finer feature map").
    encoder_stem_pool: bool = True
    image_feature_dim: int = 256
    # The last feature map becomes spatial-softmax keypoints (Chi et al., after robomimic: a 1x1
    # convolution to num_keypoints maps, a softmax over positions, the expected (x, y) of each).
    num_keypoints: int = 32
    # Denoiser: a conditional 1-D temporal U-Net with FiLM.
    down_dims: tuple[int, ...] = (256, 512, 1024)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    # Diffusion: DDPM training, DDIM inference (`noise_schedule`). beta_schedule: "squaredcos_cap_v2"
    # (Nichol & Dhariwal's squared cosine, the reference's) or "linear" (Ho et al.'s).
    num_train_timesteps: int = 100
    num_inference_steps: int = 20
    beta_schedule: str = "squaredcos_cap_v2"
    # Which DDIM steps inference visits (diffusers' name, `timestep_spacing`): "trailing" starts at the
    # last training step (pure noise, as sampling starts), "leading" at a multiple of
    # num_train_timesteps // num_inference_steps (90 of 100 for 16 steps), where some signal is
    # left that the Gaussian start does not have. The DDIM step (`noise_schedule`) always lands
    # num_train_timesteps // num_inference_steps below the current step: with "trailing" and a
    # count that does not divide num_train_timesteps (16 of 100: 99, 93, 87, 80, ...) it would land
    # on 81 while the next step is evaluated at 80, so such a count is refused.
    timestep_spacing: str = "trailing"
    # Low-dimensional normalization (normalizer.py): "min_max" to [-1, 1], with the predicted
    # clean chunk clipped to [-1, 1] while sampling, or "mean_std" (standardised, no clipping).
    normalization: str = "min_max"
    # Actions normalised per horizon step (each step's own min/max or mean/std, stats.json's
    # `action_per_step`) rather than with one range per dimension over the whole horizon: the
    # next step moves a few millimetres, the last one centimetres, and one shared range would
    # leave the executed near steps a small fraction of the denoiser's output scale.
    normalize_actions_per_step: bool = True
    # What the denoiser predicts for each gripper's opening: its change from the current opening, as
    # the dataset's actions hold it ("relative"), or the opening itself ("absolute", as UMI commands
    # its gripper). Outside the policy the action stays the change either way (`predict_action` takes
    # the current opening back off), so the runtime, eval and the baselines are the same; what
    # differs is what an error does in closed loop: a relative one adds to the last, an absolute one
    # does not (docs/rollout.md, "The privileged control").
    width_action: str = "relative"
    # What the denoiser regresses: the noise ("epsilon", as in the Diffusion Policy paper), the
    # clean chunk ("sample") or the velocity ("v_prediction", which is well conditioned at every
    # noise level). docs/training.md, "Measured choices", compares epsilon and sample.
    prediction_type: str = "epsilon"
    # Teaching the encoder what the recordings know (`dataset.events`; docs/rollout.md, "Teaching
    # the encoder what the recordings know"): the weight of an auxiliary loss in which a small head
    # on camera 0's features predicts each gripper's pose at its next grasp and at its next release,
    # relative to the current pose: labels read off the recordings' own width and pose streams by
    # `stats`. The diffusion head reads the same features, so they learn where the object is, how
    # it is turned and where it goes. 0: the plain diffusion loss, and no head.
    event_loss_weight: float = 0.0
    # Weighs the event loss towards the approach's last centimetres: each label by near / (its
    # distance + near), the next grasp's by the distance to that grasp and the next release's to
    # that release, normalised to a mean of 1 over the batch's labels, so that the far frames (two
    # thirds of the approach, with the largest labels and errors) do not drown the near ones (m;
    # docs/rollout.md, "Labels that weigh the approach's last centimetres"). 0: every label alike.
    event_loss_near_m: float = 0.0
    # What the event head reads: camera 0's features (false), or every camera's side by side (true),
    # so that the pretraining and the event loss teach a scene camera's encoder too, and
    # train.freeze_encoder keeps every camera's encoder as pretrained (docs/rollout.md, "A scene
    # camera, and the event head's predictions as a condition"). One camera: the same either way.
    events_from_every_camera: bool = False
    # The diffusion head also reads the event head's predictions (each gripper's next grasp and
    # release pose, normalised, per observation step): the few numbers the privileged control is
    # given exactly, here as the encoder sees them. Detached: only the event loss trains the head.
    # Measured in the same section of docs/rollout.md.
    condition_on_events: bool = False
    # The diffusion head also reads a memory of the mark: where the event head places each gripper's
    # next release from the episode's first frame (where the sample's mark is always in view),
    # carried to the current pose by the gripper's own recorded poses, 9 numbers a gripper
    # (normalised as the release label). A carry that has lost the mark from view still knows where
    # the start saw it (docs/rollout.md, "A memory of the mark in closed loop"). The runner keeps
    # the episode's first frame and pose (`runtime.runner`).
    remember_release: bool = False

    @property
    def joint_space(self) -> bool:
        """Observes and commands absolute joint vectors (`dataset.joint`), not gripper poses."""
        return bool(self.joint_names)

    @property
    def obs_pose_dim(self) -> int:
        """Each gripper's pose in its own frame and every other one's in it (`windows.observation_names`)."""
        return POSE_DIM * self.grippers**2

    @property
    def privileged(self) -> bool:
        """Observes the synthetic scene's state instead of seeing it (a control, never a real policy)."""
        return self.scene_state_dim > 0

    @property
    def event_labels(self) -> bool:
        """Trained with the auxiliary loss on the recordings' grasps and releases (`dataset.events`)."""
        return self.event_loss_weight > 0

    @property
    def event_cameras(self) -> int:
        """How many cameras the event head reads, from camera 0 on: every one with
        `events_from_every_camera`, else camera 0 alone."""
        return self.cameras if self.events_from_every_camera else 1

    @property
    def obs_lowdim_dim(self) -> int:
        """The low-dimensional numbers of one observation step: poses and widths, or the joints."""
        return len(self.joint_names) if self.joint_space else self.obs_pose_dim + self.grippers

    @property
    def action_dim(self) -> int:
        return len(self.joint_names) if self.joint_space else ACTION_DIM * self.grippers

    def __post_init__(self) -> None:
        if self.joint_space:
            if self.grippers != 0 or len(set(self.joint_names)) != len(self.joint_names):
                raise ValueError(
                    f"a joint-space policy observes distinct joints and no gripper pose: got grippers "
                    f"{self.grippers} and joint_names {list(self.joint_names)}"
                )
        elif self.grippers < 1:
            raise ValueError(f"a policy needs at least one gripper, got {self.grippers}")
        if self.cameras < 1:
            raise ValueError(f"a policy needs at least one camera, got {self.cameras}")
        if self.width_action not in WIDTH_ACTIONS or (self.joint_space and self.width_action != "relative"):
            raise ValueError(
                f"width_action must be one of {WIDTH_ACTIONS} (a joint-space policy commands absolute "
                f"joints: leave it at 'relative'), got {self.width_action!r}"
            )
        if self.scene_state_dim < 0 or (
            self.privileged and (self.joint_space or self.grippers != 1 or self.cameras != 1)
        ):
            raise ValueError(
                f"scene_state_dim {self.scene_state_dim}: the privileged control observes the one-gripper "
                "sample scene's state (grippers 1, cameras 1, no joints), or 0 for a policy that sees"
            )
        if not 1 <= self.n_action_steps <= self.horizon:
            raise ValueError(
                f"n_action_steps must be in 1..horizon ({self.horizon}), got {self.n_action_steps}"
            )
        if not (math.isfinite(self.event_loss_weight) and self.event_loss_weight >= 0):
            raise ValueError(f"event_loss_weight must be a finite number >= 0, got {self.event_loss_weight}")
        if not (math.isfinite(self.event_loss_near_m) and self.event_loss_near_m >= 0):
            raise ValueError(
                f"event_loss_near_m must be a finite distance >= 0 (m), got {self.event_loss_near_m}"
            )
        if self.event_loss_near_m and not self.event_labels:
            raise ValueError(
                "event_loss_near_m weighs the event loss's labels: set event_loss_weight > 0 for an "
                "event loss, or leave it 0"
            )
        if self.event_labels and (self.joint_space or self.privileged):
            raise ValueError(
                "event_loss_weight teaches an image encoder the poses of a gripper's grasps and releases: "
                "a joint-space policy has no gripper poses and the privileged control no encoder; "
                + WITHOUT_THE_LABELS
            )
        if self.condition_on_events and not self.event_labels:
            raise ValueError(
                "condition_on_events feeds the event head's predictions to the diffusion head: set "
                "event_loss_weight > 0 for an event head, or leave it false"
            )
        if self.remember_release and (not self.event_labels or self.events_from_every_camera):
            raise ValueError(
                "remember_release carries the event head's next release from the episode's first frame "
                "of camera 0: set event_loss_weight > 0 for an event head reading camera 0 alone "
                "(events_from_every_camera false), or leave it false"
            )
        if self.events_from_every_camera and not self.event_labels:
            raise ValueError(
                "events_from_every_camera says which cameras the event head reads: set event_loss_weight "
                "> 0 for an event head, or leave it false"
            )
        # Params files reach this through `train_config_from_params`, which says the same in terms
        # of the `policy` section, where the horizon is set; this guards every other way of building
        # a config (tests, a loaded policy).
        if not self.down_dims or any(d < 1 for d in self.down_dims):
            raise ValueError(f"down_dims must list at least one positive width, got {list(self.down_dims)}")
        multiple = unet_horizon_multiple(self.down_dims)
        if self.horizon % multiple:
            raise ValueError(
                f"horizon {self.horizon} must be a multiple of {multiple} for the U-Net "
                f"({len(self.down_dims)} down_dims levels)"
            )
        if any(c < 1 for c in self.crop_size) or any(c > s for c, s in zip(self.crop_size, self.image_size)):
            raise ValueError(
                f"crop_size {list(self.crop_size)} must be at least 1 and at most image_size "
                f"{list(self.image_size)} in each dimension (width, height)"
            )
        if any(w % 16 for w in self.encoder_widths):
            raise ValueError("encoder_widths must be multiples of 16 (GroupNorm uses 16 channels a group)")
        if self.num_keypoints < 1:
            raise ValueError(f"num_keypoints must be >= 1, got {self.num_keypoints}")
        feature_map = encoder_feature_map_size(self.crop_size, self.encoder_widths, self.encoder_stem_pool)
        if feature_map == (1, 1):
            # A softmax over one position is 1 whatever the image: every keypoint would be constant.
            raise ValueError(
                f"the spatial-softmax keypoints need a feature map larger than 1x1: crop_size "
                f"{list(self.crop_size)} with {len(self.encoder_widths)} encoder_widths stages gives 1x1 "
                "(each stage after the first halves it); use a larger crop or fewer stages"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        if self.timestep_spacing not in TIMESTEP_SPACINGS:
            raise ValueError(
                f"timestep_spacing must be one of {TIMESTEP_SPACINGS}, got {self.timestep_spacing!r}"
            )
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(
                f"prediction_type must be one of {PREDICTION_TYPES}, got {self.prediction_type!r}"
            )
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ValueError("num_inference_steps must be in 1..num_train_timesteps")
        if self.timestep_spacing == "trailing" and self.num_train_timesteps % self.num_inference_steps:
            divisors = [d for d in range(2, self.num_train_timesteps) if self.num_train_timesteps % d == 0]
            near = sorted(divisors, key=lambda d: abs(d - self.num_inference_steps))[:3]
            raise ValueError(
                f"num_inference_steps {self.num_inference_steps} must divide num_train_timesteps "
                f"{self.num_train_timesteps} with timestep_spacing trailing "
                "(DDIM would sample at the wrong noise "
                f"level): use {', '.join(map(str, sorted(near)))}, or timestep_spacing leading"
            )
