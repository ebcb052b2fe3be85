"""Diffusion Policy: observations -> a chunk of future actions, by denoising.

Training (DDPM): noise a normalised action chunk at a random diffusion step and regress the
noise (epsilon prediction), the clean chunk or the velocity, as `prediction_type` says.
Inference (DDIM): start from Gaussian noise and denoise in `num_inference_steps` steps, at the
diffusion steps `timestep_spacing` picks; with min/max normalization each step clips its
estimate of the clean chunk to [-1, 1]. The noise levels and both steps: `noise_schedule`.

Batch layout, with B batch, O = n_obs_steps, T = horizon, G grippers (`config.grippers`):
  obs_images   uint8 (B, O, H, W, 3)   camera 0
  obs_pose     float (B, O, 9 G^2)     gripper poses relative to the current one (pos + 6D rotation),
                                       then each other gripper's in it (`windows.observation_names`)
  obs_width    float (B, O, G)
  action       float (B, T, 10 G)      future poses relative to the current one, and the width's change
or, for a joint-space policy (`config.joint_names`, D joints; `dataset.joint`):
  obs_state    float (B, O, D)         the joint vectors at the observation steps
  action       float (B, T, D)         the commands from the current step on, absolute
and for each further camera k (`config.cameras`):
  obs_images_camera{k}  uint8 (B, O, H, W, 3)
  obs_valid_camera{k}   bool (B, O): a frame within convert.max_camera_offset_ms of the step
and the privileged control (`config.scene_state_dim` S > 0, `synthetic.privileged`) takes, in place
of the images:
  obs_scene_state  float (B, O, S)     the block and the mark in the gripper's frame at each step
Training with `config.event_loss_weight` > 0 also takes each observation step's labels from the
recordings' grasps and releases (`dataset.events`); the last step's are the targets:
  event_next_grasp    float (B, O, 9 G)  each gripper's pose at its next grasp, relative to the current
  event_next_release  float (B, O, 9 G)  its pose at its next release
  event_valid         float (B, O, 2 G)  1 where there is a next grasp / next release
A policy with a memory of its episode's start (`config.remember_release`) also takes:
  start_image  uint8 (B, H, W, 3)  camera 0's first frame of the episode
  start_pose   float (B, G, 9)     each gripper's pose at that frame relative to the current one
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policypipe.dataset import events
from policypipe.dataset.windows import ACTION_DIM, POSE_DIM
from policypipe.policy.config import PolicyConfig
from policypipe.policy.encoder import ImageEncoder
from policypipe.policy.noise_schedule import NoiseSchedule
from policypipe.policy.normalizer import ImageNormalizer, LowDimNormalizer
from policypipe.policy.unet import ConditionalUnet1D


class DiffusionPolicy(nn.Module):
    """`channels_last`: training's crops reach the encoder laid out channel last, where oneDNN's
    CPU convolutions are faster (train.channels_last; inference's centre crop always is). The same
    model: only the sums' order, and so the weights' last bits, differ."""

    def __init__(self, config: PolicyConfig, *, channels_last: bool = True) -> None:
        super().__init__()
        self.config = config
        self.channels_last = channels_last
        self.image_normalizer = ImageNormalizer()
        if config.joint_space:
            self.state_normalizer = LowDimNormalizer(config.action_dim, config.normalization)
        else:
            self.pose_normalizer = LowDimNormalizer(config.obs_pose_dim, config.normalization)
            self.width_normalizer = LowDimNormalizer(config.grippers, config.normalization)
        action_dim = config.action_dim
        action_dims = config.horizon * action_dim if config.normalize_actions_per_step else action_dim
        self.action_normalizer = LowDimNormalizer(action_dims, config.normalization)
        if config.privileged:  # the scene's state in place of the camera: nothing to encode
            self.scene_state_normalizer = LowDimNormalizer(config.scene_state_dim, config.normalization)
        else:
            self.encoder = ImageEncoder(
                config.encoder_widths,
                config.image_feature_dim,
                config.num_keypoints,
                config.encoder_stem_pool,
            )
        if config.cameras > 1:  # camera 0's modules keep their names: a one-camera policy is as before
            others = range(1, config.cameras)
            self.camera_image_normalizers = nn.ModuleList(ImageNormalizer() for _ in others)
            if not config.shared_camera_encoder:
                self.camera_encoders = nn.ModuleList(
                    ImageEncoder(
                        config.encoder_widths,
                        config.image_feature_dim,
                        config.num_keypoints,
                        config.encoder_stem_pool,
                    )
                    for _ in others
                )
            # What a camera without a frame at a step contributes: learned, not the features of a
            # black image that could pass for a view.
            self.absent_camera = nn.Parameter(
                0.02 * torch.randn(config.cameras - 1, config.image_feature_dim)
            )
        if config.event_labels:
            # Camera 0's features (every camera's, events_from_every_camera) -> each gripper's next
            # grasp and next release pose (normalised): an auxiliary head that trains the encoders
            # and that inference never reads.
            self.event_head = nn.Sequential(
                nn.Linear(config.event_cameras * config.image_feature_dim, EVENT_HEAD_WIDTH),
                nn.Mish(),
                nn.Linear(EVENT_HEAD_WIDTH, 2 * POSE_DIM * config.grippers),
            )
            self.event_normalizer = LowDimNormalizer(2 * POSE_DIM * config.grippers, "mean_std")
        seen = config.scene_state_dim if config.privileged else config.cameras * config.image_feature_dim
        if config.condition_on_events:
            seen += 2 * POSE_DIM * config.grippers
        cond_dim = config.n_obs_steps * (seen + config.obs_lowdim_dim)
        if config.remember_release:  # once per sample, not per observation step
            cond_dim += POSE_DIM * config.grippers
        self.denoiser = ConditionalUnet1D(
            action_dim,
            cond_dim,
            config.down_dims,
            config.diffusion_step_embed_dim,
            config.kernel_size,
            config.n_groups,
        )
        # Min/max-normalised training actions lie in [-1, 1], so each DDIM step clips its estimate
        # of the clean chunk there (the reference's setting); standardised ones are not bounded.
        self.noise_schedule = NoiseSchedule(
            config.num_train_timesteps,
            config.beta_schedule,
            config.prediction_type,
            clip=config.normalization == "min_max",
        )

    def fit_normalizers(self, stats: dict[str, Any]) -> None:
        """Loads the `stats` stage's statistics into the policy's own state."""
        lowdim = stats["lowdim"]
        if self.config.joint_space != ("obs.joint_state" in lowdim):
            raise ValueError(
                f"the statistics are of a {'joint-space' if 'obs.joint_state' in lowdim else 'gripper pose'} "
                f"dataset, the policy is a {'joint-space' if self.config.joint_space else 'gripper pose'} "
                "one: train on the dataset the statistics are of"
            )
        if self.config.joint_space:
            self.state_normalizer.fit(lowdim["obs.joint_state"])
        else:
            self.pose_normalizer.fit(lowdim["obs.eef_pose_rel"])
            self.width_normalizer.fit(lowdim["obs.gripper_width"])
        if self.config.privileged:
            if "obs.scene_state" not in lowdim:
                raise ValueError(
                    "the statistics have no obs.scene_state entry: the privileged control's statistics "
                    "come with its scene state (synthetic.privileged.scene_state_statistics)"
                )
            self.scene_state_normalizer.fit(lowdim["obs.scene_state"])
        if self.config.normalize_actions_per_step:
            if "action_per_step" not in stats["lowdim"]:
                raise ValueError(
                    "the statistics have no per-step action entry (made by an older stats stage): "
                    "rerun `dvc repro stats`"
                )
            action_stats = stats["lowdim"]["action_per_step"]
        else:
            action_stats = stats["lowdim"]["action"]
        if self.config.width_action == "absolute":
            action_stats = self._with_width_statistics(action_stats, lowdim["obs.gripper_width"])
        self.action_normalizer.fit(action_stats)
        # By camera number: the statistics file's keys are sorted as text (camera10 before camera2).
        image_stats = [v for _, v in sorted(stats["image"].items(), key=lambda kv: _camera_number(kv[0]))]
        if len(image_stats) != self.config.cameras:
            raise ValueError(
                f"the statistics have image statistics of {len(image_stats)} cameras, "
                f"the policy has {self.config.cameras}: train on the dataset the statistics are of"
            )
        self.image_normalizer.fit(image_stats[0])
        for normalizer, camera_stats in zip(getattr(self, "camera_image_normalizers", []), image_stats[1:]):
            normalizer.fit(camera_stats)
        if self.config.event_labels:
            labels = stats.get("events", {}).get("labels", {})
            entries = [
                labels.get(events.STATS_ENTRIES[key]) for key in (events.NEXT_GRASP, events.NEXT_RELEASE)
            ]
            if None in entries:
                raise ValueError(
                    "the statistics have no statistics of the grasp and release labels (`events.labels`, "
                    "made by the stats stage of this version from a dataset with grasps and releases): "
                    f"rerun `dvc repro stats`, or {events.WITHOUT_THE_LABELS}"
                )
            self.event_normalizer.fit({k: entries[0][k] + entries[1][k] for k in ("mean", "std")})

    def _width_dims(self) -> list[int]:
        """The action dimensions (of one step) that are grippers' openings."""
        return [ACTION_DIM * g + ACTION_DIM - 1 for g in range(self.config.grippers)]

    def _with_width_statistics(self, action: dict[str, Any], width: dict[str, Any]) -> dict[str, Any]:
        """The action statistics with each opening's dimensions (every step's, when per step) those
        of the observed opening: what an absolute opening ranges over."""
        per_step = len(action["min"]) // ACTION_DIM // self.config.grippers
        out = {key: list(values) for key, values in action.items() if key in ("min", "max", "mean", "std")}
        for key in out:
            for step in range(per_step):
                for g, dim in enumerate(self._width_dims()):
                    out[key][step * self.config.action_dim + dim] = width[key][g]
        return out

    def _width_shift(self, obs_width: torch.Tensor) -> torch.Tensor:
        """(B, 1, 10 G): what makes a relative chunk absolute in the openings (zero elsewhere): the
        current opening, the last observation step's (the windows' anchor)."""
        shift = torch.zeros(
            len(obs_width), 1, self.config.action_dim, dtype=obs_width.dtype, device=obs_width.device
        )
        if self.config.width_action == "absolute":
            shift[:, 0, self._width_dims()] = obs_width[:, -1, :]
        return shift

    def _pixels(
        self, images: torch.Tensor, normalizer: ImageNormalizer, generator: torch.Generator | None
    ) -> torch.Tensor:
        """(N, H, W, 3) uint8 -> (N, 3, h, w) standardised crops: a random crop per image in
        training, the centre crop otherwise. Cropped before normalising: the same values as the
        other way round (each pixel on its own), for the pixels that are kept only.

        The layout decides the convolutions' last bits, so each path keeps the one it had when the
        crops were cut from normalised frames: the centre crop a view of a channel-last frame,
        training's crops stacked channel first unless `channels_last`."""
        cw, ch = self.config.crop_size
        h, w = images.shape[-3:-1]
        if not self.training:
            y, x = (h - ch) // 2, (w - cw) // 2
            return normalizer(images[:, y : y + ch, x : x + cw])
        ys = torch.randint(0, h - ch + 1, (len(images),), generator=generator, device="cpu").tolist()
        xs = torch.randint(0, w - cw + 1, (len(images),), generator=generator, device="cpu").tolist()
        if self.channels_last:
            return normalizer(torch.stack([img[y : y + ch, x : x + cw] for img, y, x in zip(images, ys, xs)]))
        channel_first = images.movedim(-1, -3)
        crops = [img[:, y : y + ch, x : x + cw] for img, y, x in zip(channel_first, ys, xs)]
        return normalizer.channel_first(torch.stack(crops))

    def condition(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(B, O * (C F + 9 G^2 + G)), or (B, O * (C F + D)) in joint space: every camera's image
        features and the normalised low-dimensional state, per obs step (with `condition_on_events`
        the event head's 18 G predictions after the features; with `remember_release` the
        remembered release's 9 G numbers at the end); the privileged control's (B, O * (S + 10)) has
        the scene's state in place of the features."""
        return self._condition(batch, generator)[0]

    def _condition(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`condition`, and (B, O, E) what the event head reads: camera 0's features, or every
        camera's side by side (`events_from_every_camera`); the scene's state for the control."""
        if self.config.privileged:
            features = [self.scene_state_normalizer.normalize(batch["obs_scene_state"])]
        else:
            images = batch["obs_images"]
            b, o = images.shape[:2]
            features = [self.image_features(images.flatten(0, 1), generator).view(b, o, -1)]
        for k in range(1, self.config.cameras):
            features.append(
                self._camera_features(
                    k, batch[f"obs_images_camera{k}"], batch[f"obs_valid_camera{k}"], generator
                )
            )
        if self.config.joint_space:
            lowdim = [self.state_normalizer.normalize(batch["obs_state"])]
        else:
            lowdim = [
                self.pose_normalizer.normalize(batch["obs_pose"]),
                self.width_normalizer.normalize(batch["obs_width"]),
            ]
        seen_by_events = torch.cat(features[: self.config.event_cameras], dim=-1)
        if self.config.condition_on_events:
            features.append(self.event_head(seen_by_events).detach())
        condition = torch.cat([*features, *lowdim], dim=-1).flatten(1)
        if self.config.remember_release:
            # Normalised as the release labels: the event normaliser's second half (`fit_normalizers`).
            release = slice(POSE_DIM * self.config.grippers, None)
            scale, offset = self.event_normalizer.scale[release], self.event_normalizer.offset[release]
            remembered = self.remembered_release(batch, generator).flatten(1)  # (B, 9 G)
            condition = torch.cat([condition, remembered * scale + offset], dim=-1)
        return condition, seen_by_events

    def remembered_release(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(B, G, 9) each gripper's next release as the event head places it from the episode's first
        frame (`start_image`), carried to the current pose by `start_pose` (that frame's pose
        relative to the current one): position and 6D rotation relative to the current pose, in the
        dataset's units. Detached: the memory does not train the encoder or the head."""
        with torch.no_grad():
            release = self.predict_events(self.image_features(batch["start_image"], generator))[:, 1]
            start = batch["start_pose"]
            to_current = _rot6d_to_matrix(start[..., 3:])  # (B, G, 3, 3) current <- start
            position = (to_current @ release[..., :3, None])[..., 0] + start[..., :3]
            rotation = to_current @ _rot6d_to_matrix(release[..., 3:])
            return torch.cat([position, rotation[..., :, 0], rotation[..., :, 1]], dim=-1)

    def image_features(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(N, H, W, 3) uint8 camera 0 frames -> (N, F) its encoder's features: of a random crop in
        training, of the centre crop otherwise (what the diffusion head and the event head read)."""
        return self.encoder(self._pixels(images, self.image_normalizer, generator))

    def _camera_features(
        self, k: int, images: torch.Tensor, valid: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """(B, O, F) camera k's features of its (B, O, H, W, 3) uint8 frames, its learned absent
        embedding where (B, O) `valid` says it has no frame."""
        b, o = images.shape[:2]
        normalizer = self.camera_image_normalizers[k - 1]
        encoder = self.encoder if self.config.shared_camera_encoder else self.camera_encoders[k - 1]
        pixels = self._pixels(images.flatten(0, 1), normalizer, generator)
        features = encoder(pixels).view(b, o, -1)
        return torch.where(valid.bool()[..., None], features, self.absent_camera[k - 1].expand_as(features))

    def compute_loss(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The training loss: the denoising loss, plus `event_loss_weight` times the event loss."""
        losses = self.compute_losses(batch, generator)
        if "event" not in losses:
            return losses["diffusion"]
        return losses["diffusion"] + self.config.event_loss_weight * losses["event"]

    def compute_losses(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """{"diffusion": the denoising loss} and, with event labels, "event": the mean squared error
        of the normalised next grasp and release poses over the labels that exist (unweighted)."""
        cond, features = self._condition(batch, generator)
        losses = {"diffusion": self._denoising_loss(batch, cond, generator)}
        if self.config.event_labels:
            losses["event"] = self._event_loss(batch, features[:, -1])
        return losses

    def compute_event_loss(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The event loss alone, from what the event head reads at the last observation step (camera
        0's features, or every camera's), without the denoiser: what pretraining the encoders
        minimises (`training.pretrain`)."""
        return self._event_loss(batch, self.event_features(batch, generator))

    def event_features(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(B, E) what the event head reads at the last observation step of `batch`: camera 0's
        features, or with `events_from_every_camera` every camera's side by side."""
        features = [self.image_features(batch["obs_images"][:, -1], generator)]
        for k in range(1, self.config.event_cameras):
            # The last step's frames alone: the earlier ones would be encoded for nothing.
            images, valid = batch[f"obs_images_camera{k}"][:, -1:], batch[f"obs_valid_camera{k}"][:, -1:]
            features.append(self._camera_features(k, images, valid, generator)[:, 0])
        return torch.cat(features, dim=-1)

    def event_encoders(self) -> list[nn.Module]:
        """The encoders whose features the event head reads: what pretraining trains and
        train.freeze_encoder freezes (camera 0's, and with events_from_every_camera every camera's)."""
        if self.config.event_cameras > 1 and not self.config.shared_camera_encoder:
            return [self.encoder, *self.camera_encoders]
        return [self.encoder]

    def predict_events(self, features: torch.Tensor) -> torch.Tensor:
        """(B, E) what the event head reads (camera 0's features, or every camera's side by side) ->
        (B, 2, G, 9) each gripper's predicted pose at its next grasp (index 0) and its next release
        (1), relative to the current pose, in the dataset's units."""
        out = self.event_normalizer.unnormalize(self.event_head(features))
        return out.view(len(features), 2, self.config.grippers, POSE_DIM)

    def _event_loss(self, batch: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        target = torch.cat([batch[events.NEXT_GRASP][:, -1], batch[events.NEXT_RELEASE][:, -1]], dim=-1)
        error = (self.event_head(features) - self.event_normalizer.normalize(target)) ** 2  # (B, 2 * 9 G)
        g = self.config.grippers
        # (B, 2 G) valid flags [grasp g0, release g0, grasp g1, ...] -> the layout of the targets,
        # [grasp g0 (9), grasp g1 (9), ..., release g0 (9), ...]
        valid = batch[events.VALID][:, -1].view(-1, g, 2).transpose(1, 2).reshape(-1, 2 * g)
        mask = valid.repeat_interleave(POSE_DIM, dim=-1).to(error.dtype)
        if self.config.event_loss_near_m > 0:
            distance = target.view(len(target), 2 * g, POSE_DIM)[..., :3].norm(dim=-1)  # (B, 2 G) m
            mask = near_label_weights(distance, mask, self.config.event_loss_near_m)
        return (error * mask).sum() / mask.sum().clamp_min(1.0)

    def _denoising_loss(
        self, batch: dict[str, torch.Tensor], cond: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        actions = batch["action"]
        if self.config.width_action == "absolute":
            actions = actions + self._width_shift(batch["obs_width"])
        actions = self.normalize_actions(actions)
        device = actions.device
        noise = torch.randn(actions.shape, generator=generator, device="cpu").to(device)
        steps = torch.randint(
            0, self.config.num_train_timesteps, (len(actions),), generator=generator, device="cpu"
        ).to(device)
        noisy = self.noise_schedule.add_noise(actions, noise, steps)
        return F.mse_loss(self.denoiser(noisy, steps, cond), self._target(actions, noise, steps))

    def _target(self, actions: torch.Tensor, noise: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        kind = self.config.prediction_type
        if kind == "epsilon":
            return noise
        if kind == "sample":
            return actions
        return self.noise_schedule.velocity(actions, noise, steps)

    def forward(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The training loss: calling the module (not a method) lets DDP and autocast wrap it."""
        return self.compute_loss(batch, generator)

    @torch.no_grad()
    def predict_action(
        self,
        batch: dict[str, torch.Tensor],
        generator: torch.Generator | None = None,
        condition: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, horizon, 10 G) actions (joint space: (B, horizon, D) commands) in the dataset's units
        and representation (the openings as changes, whatever `width_action`); the first
        n_action_steps are executed. `condition`: the batch's `condition`, where the caller has it
        already (the runtime monitor reads it too), so that the encoder runs once."""
        cond = self.condition(batch) if condition is None else condition
        b = cond.shape[0]
        sample = torch.randn(
            (b, self.config.horizon, self.config.action_dim), generator=generator, device="cpu"
        ).to(cond.device)
        count = self.config.num_inference_steps
        for step in self.noise_schedule.inference_steps(count, self.config.timestep_spacing):
            output = self.denoiser(sample, torch.full((b,), step, device=cond.device), cond)
            sample = self.noise_schedule.ddim_step(output, step, sample, count)
        actions = self.unnormalize_actions(sample)
        if self.config.width_action == "absolute":  # back to the dataset's: the change from the current
            actions = actions - self._width_shift(batch["obs_width"])
        return actions

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(B, T, 10 G) -> normalised, per horizon step and dimension or per dimension."""
        if self.config.normalize_actions_per_step:
            return self.action_normalizer.normalize(actions.flatten(-2)).view_as(actions)
        return self.action_normalizer.normalize(actions)

    def unnormalize_actions(self, normalized: torch.Tensor) -> torch.Tensor:
        if self.config.normalize_actions_per_step:
            return self.action_normalizer.unnormalize(normalized.flatten(-2)).view_as(normalized)
        return self.action_normalizer.unnormalize(normalized)


def _rot6d_to_matrix(r6: torch.Tensor) -> torch.Tensor:
    """(..., 6) -> (..., 3, 3): `windows.rot6d_to_matrix` in torch (Gram-Schmidt on the two columns)."""
    c1 = F.normalize(r6[..., :3], dim=-1)
    b = r6[..., 3:6]
    c2 = F.normalize(b - (c1 * b).sum(-1, keepdim=True) * c1, dim=-1)
    return torch.stack([c1, c2, torch.cross(c1, c2, dim=-1)], dim=-1)


def near_label_weights(distance: torch.Tensor, mask: torch.Tensor, near_m: float) -> torch.Tensor:
    """The event loss's weights with `event_loss_near_m`: (B, L) each label's distance to its event
    (m) and the (B, L * 9) 0/1 mask of its valid numbers -> (B, L * 9) weights, near_m / (distance +
    near_m) a label, scaled so that the valid numbers' weights average 1 (the loss keeps its size
    whatever the batch's distances); 0 where the mask is."""
    weight = (near_m / (distance + near_m)).repeat_interleave(POSE_DIM, dim=-1)
    return mask * weight / (weight * mask).sum().clamp_min(1e-8) * mask.sum()


# Hidden units of the event head (`config.event_loss_weight`): small beside the encoder it trains.
EVENT_HEAD_WIDTH = 256


def _camera_number(key: str) -> int:
    """The camera of an image statistics key, `data/camera{k}_rgb` (`dataset.layout.camera_rgb`)."""
    digits = key.rsplit("camera", 1)[-1].split("_", 1)[0]
    if not digits.isdigit():
        raise ValueError(f"image statistics key {key!r} names no camera: rerun `dvc repro stats`")
    return int(digits)
