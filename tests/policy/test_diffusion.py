"""The policy's shapes, its normalizer state, and a golden check of a few training steps on CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load, save

from policypipe.dataset.windows import rot6d_to_matrix
from policypipe.policy.config import PolicyConfig
from policypipe.policy.diffusion import DiffusionPolicy, near_label_weights

TINY = PolicyConfig(
    horizon=8,
    n_action_steps=4,
    image_size=(32, 32),
    crop_size=(28, 28),
    encoder_widths=(16, 32),
    image_feature_dim=32,
    down_dims=(32, 64),
    diffusion_step_embed_dim=32,
    num_inference_steps=4,
)


def fake_stats() -> dict:
    def entry(dim, lo, hi):
        return {
            "min": [lo] * dim,
            "max": [hi] * dim,
            "mean": [(lo + hi) / 2] * dim,
            "std": [(hi - lo) / 4] * dim,
        }

    return {
        "lowdim": {
            "obs.eef_pose_rel": entry(9, -0.1, 0.1),
            "obs.gripper_width": entry(1, 0.02, 0.08),
            "action": entry(10, -0.2, 0.2),
            "action_per_step": entry(TINY.horizon * 10, -0.2, 0.2),
        },
        "image": {"data/camera0_rgb": {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}},
    }


def batch(b: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs_images": torch.randint(0, 256, (b, 2, 32, 32, 3), generator=g, dtype=torch.uint8),
        "obs_pose": 0.1 * torch.randn(b, 2, 9, generator=g),
        "obs_width": 0.05 + 0.01 * torch.randn(b, 2, 1, generator=g),
        # Within fake_stats' training range, as training actions are.
        "action": 0.2 * (2 * torch.rand(b, 8, 10, generator=g) - 1),
    }


def make_policy(seed: int = 0) -> DiffusionPolicy:
    torch.manual_seed(seed)
    policy = DiffusionPolicy(TINY)
    policy.fit_normalizers(fake_stats())
    return policy


def test_shapes_of_loss_and_predicted_actions() -> None:
    policy = make_policy()
    policy.train()
    loss = policy.compute_loss(batch(), torch.Generator().manual_seed(1))
    assert loss.shape == () and torch.isfinite(loss)
    policy.eval()
    actions = policy.predict_action(batch(), torch.Generator().manual_seed(2))
    assert actions.shape == (3, 8, 10) and torch.isfinite(actions).all()


def test_normalizer_travels_with_the_weights() -> None:
    policy = make_policy()
    blob = save(policy.state_dict())
    fresh = DiffusionPolicy(TINY)  # unfitted
    fresh.load_state_dict(load(blob))
    assert torch.equal(fresh.action_normalizer.scale, policy.action_normalizer.scale)
    assert torch.equal(fresh.image_normalizer.std, policy.image_normalizer.std)


# Golden: the first losses of the run below with torch 2.13.0 on CPU (float32). A change in the
# model, its initialisation, the schedule or the seeding moves them.
GOLDEN_FIRST_LOSSES = [1.098463, 0.839534, 0.724497, 0.621137, 0.553109]


def test_a_few_training_steps_match_the_golden_run_and_reduce_the_loss() -> None:
    def run() -> list[float]:
        policy = make_policy(seed=0)
        policy.train()
        optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
        fixed = batch(b=8, seed=3)
        losses = []
        for _ in range(25):
            # The same noise, diffusion steps and crops every step: a fixed regression target.
            loss = policy.compute_loss(fixed, torch.Generator().manual_seed(5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    first, second = run(), run()
    assert first == second  # bitwise: same seeds, same CPU, same steps
    assert first[: len(GOLDEN_FIRST_LOSSES)] == pytest.approx(GOLDEN_FIRST_LOSSES, rel=1e-4)
    assert first[-1] < 0.5 * first[0]  # it learns


class Oracle(torch.nn.Module):
    """A denoiser that knows the clean chunk: it answers exactly what each prediction type asks."""

    def __init__(self, policy: DiffusionPolicy, clean: torch.Tensor) -> None:
        super().__init__()
        self.schedule, self.kind, self.clean = policy.noise_schedule, policy.config.prediction_type, clean

    def forward(self, noisy: torch.Tensor, steps: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        schedule, kind = self.schedule, self.kind
        alpha_bar = schedule.alphas_cumprod[steps].view(-1, 1, 1)
        noise = (noisy - alpha_bar.sqrt() * self.clean) / (
            1 - alpha_bar
        ).sqrt()  # what this sample's noise must be
        if kind == "epsilon":
            return noise
        if kind == "sample":
            return self.clean
        return schedule.velocity(self.clean, noise, steps)


@pytest.mark.parametrize("kind", ["epsilon", "sample", "v_prediction"])
def test_each_prediction_type_trains_on_its_own_target_and_samples_the_chunk_it_predicts(kind: str) -> None:
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(TINY, prediction_type=kind))
    policy.fit_normalizers(fake_stats())
    data = batch()
    clean = policy.normalize_actions(data["action"])
    policy.denoiser = Oracle(policy, clean)
    policy.train()
    assert policy.compute_loss(data, torch.Generator().manual_seed(1)).item() < 1e-8
    policy.eval()
    predicted = policy.predict_action(data, torch.Generator().manual_seed(2))
    assert torch.allclose(predicted, data["action"], atol=2e-4)


def test_an_unknown_prediction_type_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="prediction_type must be one of"):
        PolicyConfig(prediction_type="noise")


@pytest.mark.parametrize("kind", ["epsilon", "sample", "v_prediction"])
def test_min_max_sampling_clips_the_clean_chunk_to_the_training_range_and_mean_std_does_not(
    kind: str,
) -> None:
    data = batch()
    far = torch.full((3, 8, 10), 3.0)  # normalised, outside [-1, 1]
    far[..., 1::2] = -3.0
    predicted = {}
    for mode in ("min_max", "mean_std"):
        torch.manual_seed(0)
        policy = DiffusionPolicy(replace(TINY, prediction_type=kind, normalization=mode))
        policy.fit_normalizers(fake_stats())
        policy.denoiser = Oracle(policy, far)  # a denoiser sure of a chunk outside [-1, 1]
        predicted[mode] = policy.eval().predict_action(data, torch.Generator().manual_seed(2))
        unclipped = policy.unnormalize_actions(far)
    # fake_stats' actions span [-0.2, 0.2] in every dimension: the chunk stops at their edge.
    assert torch.allclose(predicted["min_max"], 0.2 * far.sign(), atol=1e-5)
    assert torch.allclose(predicted["mean_std"], unclipped, atol=1e-3)  # +-0.3: beyond that range


class Recorder(torch.nn.Module):
    """A denoiser that notes the diffusion step of each call and predicts zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    def forward(self, noisy: torch.Tensor, steps: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        self.steps.append(int(steps[0]))
        return torch.zeros_like(noisy)


@pytest.mark.parametrize(
    ("spacing", "train_steps", "inference_steps", "expected"),
    [
        # Lin et al., "Common Diffusion Noise Schedules and Sample Steps are Flawed", Table 2,
        # 0-based as the diffusion steps are counted here.
        ("leading", 1000, 10, [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]),
        ("trailing", 1000, 10, [999, 899, 799, 699, 599, 499, 399, 299, 199, 99]),
        # The demo's 100 training and 20 inference steps; 16, the reference's count, with leading.
        ("leading", 100, 20, list(range(95, -1, -5))),
        ("trailing", 100, 20, list(range(99, 3, -5))),
        ("leading", 100, 16, [90, 84, 78, 72, 66, 60, 54, 48, 42, 36, 30, 24, 18, 12, 6, 0]),
    ],
)
def test_sampling_visits_the_diffusion_steps_of_its_timestep_spacing(
    spacing, train_steps, inference_steps, expected
) -> None:
    config = replace(
        TINY, timestep_spacing=spacing, num_train_timesteps=train_steps, num_inference_steps=inference_steps
    )
    policy = DiffusionPolicy(config)
    policy.denoiser = recorder = Recorder()
    policy.eval().predict_action(batch(), torch.Generator().manual_seed(0))
    assert recorder.steps == expected


def test_trailing_spacing_refuses_a_step_count_that_would_sample_at_the_wrong_noise_level() -> None:
    # The DDIM step always steps down by num_train_timesteps // num_inference_steps: trailing
    # 16 of 100 would visit 99, 93, 87, 80 but land on 81 before it asks the network about 80.
    with pytest.raises(
        ValueError, match=r"num_inference_steps 16 must divide num_train_timesteps 100.*10, 20, 25"
    ):
        replace(TINY, timestep_spacing="trailing", num_train_timesteps=100, num_inference_steps=16)


def test_each_cameras_image_statistics_reach_its_own_normalizer_past_ten_cameras() -> None:
    """The statistics file sorts its keys as text, camera10 before camera1: the policy orders them
    by camera number."""
    stats = fake_stats()
    stats["image"] = {
        key: {"mean": [k / 100] * 3, "std": [0.2] * 3}
        for key, k in sorted((f"data/camera{k}_rgb", k) for k in range(12))
    }
    assert list(stats["image"])[:3] == ["data/camera0_rgb", "data/camera10_rgb", "data/camera11_rgb"]
    policy = DiffusionPolicy(replace(TINY, cameras=12, shared_camera_encoder=True))
    policy.fit_normalizers(stats)
    means = [policy.image_normalizer.mean[0].item()] + [
        n.mean[0].item() for n in policy.camera_image_normalizers
    ]
    assert means == pytest.approx([k / 100 for k in range(12)])


def test_an_absolute_opening_is_commanded_whatever_the_current_one_and_a_relative_one_adds_to_it() -> None:
    """The denoiser sure of one normalised chunk: with width_action absolute the commanded opening
    (current + the returned change, as the runner composes it) is that chunk's, whatever the gripper
    reads now; with relative it moves with the current opening, so an error in it is carried on."""
    commanded = {}
    for kind in ("relative", "absolute"):
        torch.manual_seed(0)
        policy = DiffusionPolicy(replace(TINY, prediction_type="sample", width_action=kind))
        policy.fit_normalizers(fake_stats())
        policy.denoiser = Oracle(policy, torch.zeros(3, 8, 10))  # the middle of every range
        data = batch()
        data["obs_width"][:, -1, 0] = torch.tensor([0.03, 0.05, 0.07])
        change = policy.eval().predict_action(data, torch.Generator().manual_seed(2))[..., 9]
        commanded[kind] = data["obs_width"][:, -1, :] + change
    # fake_stats: openings 0.02-0.08 (middle 0.05); changes -0.2-0.2 (middle 0).
    assert torch.allclose(commanded["absolute"], torch.full((3, 8), 0.05), atol=1e-6)
    assert torch.allclose(
        commanded["relative"], torch.tensor([0.03, 0.05, 0.07])[:, None].expand(3, 8), atol=1e-6
    )


def test_an_absolute_opening_trains_on_the_opening_itself() -> None:
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(TINY, prediction_type="sample", width_action="absolute"))
    policy.fit_normalizers(fake_stats())
    data = batch()
    data["action"][..., 9] *= 0.05  # openings within fake_stats' 0.02-0.08, where min/max clipping keeps them
    absolute = data["action"].clone()
    absolute[..., 9] += data["obs_width"][:, -1, :]
    policy.denoiser = Oracle(policy, policy.normalize_actions(absolute))
    assert policy.train().compute_loss(data, torch.Generator().manual_seed(1)).item() < 1e-8
    predicted = policy.eval().predict_action(data, torch.Generator().manual_seed(2))
    assert torch.allclose(predicted, data["action"], atol=2e-4)
    with pytest.raises(ValueError, match="width_action must be one of"):
        PolicyConfig(width_action="closed")


def test_training_crops_are_the_same_pixels_in_either_layout_cropped_before_normalising() -> None:
    images = batch(4)["obs_images"].flatten(0, 1)
    crops = {}
    for channels_last in (True, False):
        policy = make_policy()
        policy.channels_last = channels_last
        policy.fit_normalizers(fake_stats())
        generator = torch.Generator().manual_seed(3)
        crops[channels_last] = policy._pixels(images, policy.image_normalizer, generator)
    fast, earlier = crops[True], crops[False]
    assert fast.shape == (8, 3, 28, 28) and torch.equal(fast, earlier)
    assert fast.is_contiguous(memory_format=torch.channels_last) and earlier.is_contiguous()
    # The crop positions, drawn as before, on the normalised whole frames: the same numbers.
    generator = torch.Generator().manual_seed(3)
    ys = torch.randint(0, 5, (8,), generator=generator).tolist()
    xs = torch.randint(0, 5, (8,), generator=generator).tolist()
    whole = policy.image_normalizer(images)
    expected = torch.stack([img[:, y : y + 28, x : x + 28] for img, y, x in zip(whole, ys, xs)])
    assert torch.equal(fast, expected)
    # Inference: the centre crop of the normalised frame.
    policy.eval()
    assert torch.equal(policy._pixels(images, policy.image_normalizer, None), whole[:, :, 2:30, 2:30])


def event_stats() -> dict:
    stats = fake_stats()
    entry = {"mean": [0.0] * 9, "std": [0.05] * 3 + [0.5] * 6, "min": [-1.0] * 9, "max": [1.0] * 9}
    stats["events"] = {"labels": {"event.next_grasp": entry, "event.next_release": entry}}
    return stats


def event_batch(b: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    valid = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])[:b]
    return batch(b, seed) | {
        "event_next_grasp": 0.05 * torch.randn(b, 2, 9, generator=g),
        "event_next_release": 0.05 * torch.randn(b, 2, 9, generator=g),
        "event_valid": valid[:, None].expand(b, 2, 2).clone(),
    }


def test_the_event_loss_trains_the_encoder_towards_the_labels_that_exist_and_nothing_else() -> None:
    config = replace(TINY, event_loss_weight=0.5)
    torch.manual_seed(0)
    policy = DiffusionPolicy(config)
    policy.fit_normalizers(event_stats())
    b = event_batch()
    losses = policy.compute_losses(b, torch.Generator().manual_seed(1))
    total = policy.compute_loss(b, torch.Generator().manual_seed(1))
    assert total.item() == pytest.approx((losses["diffusion"] + 0.5 * losses["event"]).item(), rel=1e-6)

    # A label that does not exist (after the last grasp, or the last release) is never a target ...
    policy.eval()  # the centre crop: the same features each call
    changed = dict(b, event_next_grasp=b["event_next_grasp"].clone())
    changed["event_next_grasp"][1, -1] += 1.0  # sample 1 has no next grasp
    changed["event_next_grasp"][0, 0] += 1.0  # an older observation step's labels are not targets
    assert policy.compute_losses(changed)["event"].item() == policy.compute_losses(b)["event"].item()
    changed["event_next_grasp"][2, -1] += 1.0  # ... one that does is
    assert policy.compute_losses(changed)["event"].item() != policy.compute_losses(b)["event"].item()

    # The event loss alone reaches the image encoder, and training lowers it (on the centre crops
    # of one batch: a fit, not a generalisation).
    policy.zero_grad()
    losses["event"].backward()
    assert policy.encoder.stem[0].weight.grad.abs().sum() > 0
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    first = None
    for _ in range(30):
        loss = policy.compute_losses(b)["event"]
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5 * first


def test_the_near_weights_favour_labels_near_their_event_and_average_one() -> None:
    # Two samples' labels [grasp, release], 0, 5, 15 cm from their events, and one that does not exist.
    distance = torch.tensor([[0.0, 0.05], [0.15, 0.10]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]]).repeat_interleave(9, dim=-1)
    weight = near_label_weights(distance, mask, near_m=0.05).view(2, 2, 9)
    # near / (distance + near): 1, 1/2, 1/4, each the same over a label's nine numbers ...
    assert torch.equal(weight, weight[..., :1].expand(2, 2, 9))
    per_label = weight[..., 0]
    assert per_label[0, 0] / per_label[0, 1] == pytest.approx(2.0)
    assert per_label[0, 1] / per_label[1, 0] == pytest.approx(2.0)
    # ... nothing for the label that does not exist, and a mean of 1 over those that do.
    assert per_label[1, 1] == 0
    assert weight.sum().item() == pytest.approx(mask.sum().item())


def test_the_near_weighted_event_loss_counts_a_near_labels_error_more_than_a_far_ones() -> None:
    torch.manual_seed(0)
    plain = DiffusionPolicy(replace(TINY, event_loss_weight=1.0))
    plain.fit_normalizers(event_stats())
    near = DiffusionPolicy(replace(TINY, event_loss_weight=1.0, event_loss_near_m=0.05))
    near.load_state_dict(plain.state_dict())
    plain.eval(), near.eval()  # the centre crop: the same features each call
    b = event_batch()
    # Every label 10 cm from its event: the weights are all 1, the loss the plain one.
    for key in ("event_next_grasp", "event_next_release"):
        b[key][..., :3] = torch.tensor([0.0, 0.1, 0.0])
    assert near.compute_event_loss(b).item() == pytest.approx(plain.compute_event_loss(b).item(), rel=1e-6)

    # Sample 0's next grasp 1 cm away, sample 2's 30 cm: the same error in either's turn (which
    # leaves the distances, so the weights, as they are) costs 35/6 times as much near as far,
    # relative to the plain loss.
    b["event_next_grasp"][0, -1, :3] = torch.tensor([0.01, 0.0, 0.0])
    b["event_next_grasp"][2, -1, :3] = torch.tensor([0.0, 0.0, 0.3])

    def cost_of_an_error(policy: DiffusionPolicy, sample: int) -> float:
        turned = dict(b, event_next_grasp=b["event_next_grasp"].clone())
        turned["event_next_grasp"][sample, -1, 3:] += 0.5
        return policy.compute_event_loss(turned).item() - policy.compute_event_loss(b).item()

    ratio_near = cost_of_an_error(near, 0) / cost_of_an_error(near, 2)
    ratio_plain = cost_of_an_error(plain, 0) / cost_of_an_error(plain, 2)
    assert ratio_near / ratio_plain == pytest.approx((0.3 + 0.05) / (0.01 + 0.05), rel=1e-3)


def test_a_policy_without_the_event_loss_has_no_head_and_one_with_it_predicts_poses() -> None:
    assert not any(name.startswith("event") for name in make_policy().state_dict())
    policy = DiffusionPolicy(replace(TINY, event_loss_weight=1.0))
    policy.fit_normalizers(event_stats())
    assert policy.predict_events(torch.zeros(3, TINY.image_feature_dim)).shape == (3, 2, 1, 9)


def test_the_event_loss_needs_the_labels_statistics_and_a_policy_that_sees() -> None:
    policy = DiffusionPolicy(replace(TINY, event_loss_weight=1.0))
    with pytest.raises(ValueError, match=r"rerun `dvc repro stats`, or train without the labels") as refused:
        policy.fit_normalizers(fake_stats())
    # All three params that use the labels, so that following the message leaves a valid config.
    wanted = "event_loss_weight 0, train.model.event_loss_near_m 0, train.encoder_pretrain_steps 0 and "
    wanted += "train.freeze_encoder false"
    assert wanted in str(refused.value)
    with pytest.raises(ValueError, match="event_loss_weight must be a finite number >= 0"):
        replace(TINY, event_loss_weight=-1.0)
    for bad in (-0.01, float("nan")):
        with pytest.raises(ValueError, match="event_loss_near_m must be a finite distance >= 0"):
            replace(TINY, event_loss_weight=1.0, event_loss_near_m=bad)
    with pytest.raises(ValueError, match="event_loss_near_m weighs the event loss's labels"):
        replace(TINY, event_loss_near_m=0.05)
    with pytest.raises(ValueError, match="the privileged control no encoder"):
        replace(TINY, event_loss_weight=1.0, scene_state_dim=8, n_obs_steps=1)


def scene_camera_policy(every_camera: bool) -> DiffusionPolicy:
    """A fitted two-camera policy with an event head reading camera 0, or both (`every_camera`)."""
    config = replace(TINY, cameras=2, event_loss_weight=1.0, events_from_every_camera=every_camera)
    torch.manual_seed(0)
    policy = DiffusionPolicy(config)
    stats = event_stats()
    stats["image"]["data/camera1_rgb"] = {"mean": [0.4] * 3, "std": [0.3] * 3}
    policy.fit_normalizers(stats)
    return policy


def scene_camera_batch(valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """`event_batch` with camera 1's frames, present where the (4, 2) `valid` says."""
    g = torch.Generator().manual_seed(2)
    return event_batch() | {
        "obs_images_camera1": torch.randint(0, 256, (4, 2, 32, 32, 3), generator=g, dtype=torch.uint8),
        "obs_valid_camera1": valid,
    }


@pytest.mark.parametrize("every_camera", [False, True])
def test_the_event_head_reads_the_scene_cameras_features_only_when_asked(every_camera: bool) -> None:
    policy = scene_camera_policy(every_camera)
    b = scene_camera_batch(torch.ones(4, 2, dtype=torch.bool))
    seen = (2 if every_camera else 1) * TINY.image_feature_dim
    assert policy.predict_events(torch.zeros(3, seen)).shape == (3, 2, 1, 9)
    # What pretraining trains and freeze_encoder freezes: the encoders the event head reads.
    scene_encoder = policy.camera_encoders[0]
    assert any(m is scene_encoder for m in policy.event_encoders()) == every_camera
    # The event loss, in pretraining and in training alike, reaches the scene camera's encoder
    # only when the head reads it.
    for loss in (policy.compute_event_loss(b), policy.compute_losses(b)["event"]):
        policy.zero_grad()
        loss.backward()
        grad = scene_encoder.stem[0].weight.grad
        assert (grad is not None and grad.abs().sum() > 0) == every_camera
        assert policy.encoder.stem[0].weight.grad.abs().sum() > 0


def test_pretraining_and_the_probe_read_what_the_event_head_reads_in_training() -> None:
    # Two observation steps, both cameras read: the event head reads the last step's features.
    policy = scene_camera_policy(every_camera=True)
    assert policy.config.n_obs_steps == 2 and policy.config.event_cameras == 2
    policy.eval()  # the centre crop: the same features each call
    b = scene_camera_batch(torch.tensor([[True, True], [True, False], [False, True], [True, True]]))
    seen = policy.event_features(b)
    # The features the training loss gives the head at the last step (a missing frame included) ...
    torch.testing.assert_close(seen, policy._condition(b, None)[1][:, -1])
    # ... and nothing of an earlier step's frames.
    earlier = b | {"obs_images_camera1": b["obs_images_camera1"].clone()}
    earlier["obs_images_camera1"][:, 0] = 255 - earlier["obs_images_camera1"][:, 0]
    torch.testing.assert_close(policy.event_features(earlier), seen)
    assert not torch.allclose(policy._condition(earlier, None)[1][:, 0], policy._condition(b, None)[1][:, 0])


def test_reading_every_cameras_features_needs_an_event_head() -> None:
    with pytest.raises(ValueError, match="set event_loss_weight > 0 for an event head"):
        replace(TINY, cameras=2, events_from_every_camera=True)


def event_policy(**changes) -> DiffusionPolicy:
    """A policy with an event head and `changes`, fit on `event_stats`, in eval mode (the centre
    crop: the same features each call)."""
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(TINY, event_loss_weight=1.0, **changes))
    policy.fit_normalizers(event_stats())
    return policy.eval()


def test_a_head_conditioned_on_the_events_reads_the_event_heads_predictions_and_never_trains_it() -> None:
    policy = event_policy(condition_on_events=True)
    config = policy.config
    b = event_batch()
    # Per observation step: the features, the 18 predictions (grasp and release, 9 each), pose and width.
    assert policy.condition(b).shape == (4, config.n_obs_steps * (config.image_feature_dim + 18 + 9 + 1))
    # The condition carries the head's predictions: other head weights, another condition ...
    before = policy.condition(b)
    with torch.no_grad():
        policy.event_head[-1].bias += 0.5
    assert not torch.allclose(policy.condition(b), before)
    # ... and only the event loss trains the head: the denoising loss leaves it without a gradient.
    policy.zero_grad()
    policy.compute_losses(b)["diffusion"].backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.event_head.parameters())
    assert policy.encoder.stem[0].weight.grad.abs().sum() > 0


def test_a_policy_that_remembers_its_start_reads_the_release_seen_then_carried_to_the_current_pose() -> None:
    policy = event_policy(remember_release=True)
    config = policy.config
    g = torch.Generator().manual_seed(5)
    identity = torch.tensor([0.0] * 3 + [1, 0, 0, 0, 1, 0])
    b = event_batch() | {
        "start_image": torch.randint(0, 256, (4, 32, 32, 3), generator=g, dtype=torch.uint8),
        "start_pose": identity.expand(4, 1, 9).clone(),
    }
    # Per observation step the features, pose and width; then the remembered release, once.
    assert policy.condition(b).shape == (4, config.n_obs_steps * (config.image_feature_dim + 9 + 1) + 9)
    with torch.no_grad():  # (B, G, 9) the release as seen from the start
        seen = policy.predict_events(policy.image_features(b["start_image"]))[:, 1]
    r = torch.from_numpy(rot6d_to_matrix(seen[..., 3:].double().numpy())).float()  # its rotation
    # Still at the start: the release as the start saw it (the rotation's two columns orthonormal).
    torch.testing.assert_close(
        policy.remembered_release(b), torch.cat([seen[..., :3], r[..., 0], r[..., 1]], -1)
    )
    # Moved: the start is 0.1 m ahead (x) and turned 90 degrees about z from the current pose, so
    # the release, seen (p, R) from the start, is at (0.1, 0, 0) + Rz p and turned Rz R from here.
    rz = torch.tensor([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]])
    b["start_pose"] = torch.cat([torch.tensor([0.1, 0, 0]), rz[:, 0], rz[:, 1]]).expand(4, 1, 9).clone()
    carried = policy.remembered_release(b)
    torch.testing.assert_close(carried[..., :3], torch.tensor([0.1, 0, 0]) + seen[..., :3] @ rz.T)
    torch.testing.assert_close(carried[..., 3:6], (rz @ r)[..., :, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(carried[..., 6:], (rz @ r)[..., :, 1], atol=1e-6, rtol=0)
    # The condition reads the start frame ...
    before = policy.condition(b)
    b["start_image"] = 255 - b["start_image"]
    assert not torch.allclose(policy.condition(b), before)
    # ... and the memory trains nothing: the denoising loss leaves the head without a gradient.
    policy.train()
    policy.zero_grad()
    policy.compute_losses(b)["diffusion"].backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.event_head.parameters())


def test_remembering_the_release_needs_an_event_head_reading_camera_0() -> None:
    with pytest.raises(ValueError, match="remember_release carries the event head's next release"):
        replace(TINY, remember_release=True)


def test_conditioning_on_the_events_needs_an_event_head() -> None:
    with pytest.raises(ValueError, match="condition_on_events feeds the event head's predictions"):
        replace(TINY, condition_on_events=True)
