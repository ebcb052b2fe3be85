"""Training on a rig dataset (two grippers, three cameras): the policy reads every gripper and
camera, a camera without a frame contributes its learned absent embedding, and the smoke check's
exact resume holds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from policypipe.atomic import write_json_atomic
from policypipe.config import ConfigError
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.config import model_for_dataset, train_config_from_params
from policypipe.training.loop import train
from policypipe.training.smoke import run_smoke
from tests.dataset.test_rig import SCENE, rig_dataset, rig_export  # noqa: F401 - fixtures
from tests.training.conftest import CONFIG, WINDOW

MODEL = replace(CONFIG.model, image_size=(64, 48), crop_size=(56, 40))
RIG_CONFIG = replace(CONFIG, model=MODEL, steps=6)


@pytest.fixture(scope="module")
def rig_stats(rig_dataset, tmp_path_factory) -> tuple[Path, Path]:  # noqa: F811
    root, _, _ = rig_dataset
    stats = compute_statistics(root, WINDOW, StatsConfig(val_fraction=0.34, test_fraction=0.0))
    stats["dataset_fingerprint"] = {"sha256": "e" * 64}
    path = tmp_path_factory.mktemp("rig_stats") / "stats.json"
    write_json_atomic(path, stats)
    return Path(root.store.root), path


def policy_and_batch(rig_stats, shared: bool = False):
    store, stats_path = rig_stats
    import json

    stats = json.loads(stats_path.read_text())
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(model_for_dataset(MODEL, stats), shared_camera_encoder=shared))
    policy.fit_normalizers(stats)
    data = WindowDataset(store, stats["split"]["train"], WINDOW)
    items = [data[i] for i in range(0, len(data), max(1, len(data) // 8))][:8]
    return policy.eval(), {k: torch.stack([it[k] for it in items]) for k in items[0]}


def test_the_policy_reads_every_gripper_and_camera(rig_stats) -> None:
    policy, batch = policy_and_batch(rig_stats)
    assert (policy.config.grippers, policy.config.cameras) == (2, 3)
    assert batch["obs_pose"].shape[-1] == 36 and batch["obs_width"].shape[-1] == 2
    assert batch["obs_images_camera2"].shape == batch["obs_images"].shape
    assert len(policy.camera_encoders) == 2
    chunk = policy.predict_action(
        {k: v for k, v in batch.items() if k != "action"}, torch.Generator().manual_seed(0)
    )
    assert chunk.shape == (len(batch["action"]), WINDOW.horizon, 20)
    # Each camera moves the conditioning: its images are used.
    for k in (1, 2):
        changed = dict(batch)
        changed[f"obs_images_camera{k}"] = 255 - batch[f"obs_images_camera{k}"]
        changed[f"obs_valid_camera{k}"] = torch.ones_like(batch[f"obs_valid_camera{k}"])
        valid = dict(batch, **{f"obs_valid_camera{k}": changed[f"obs_valid_camera{k}"]})
        assert not torch.allclose(policy.condition(valid), policy.condition(changed)), k


def test_a_camera_without_a_frame_contributes_its_absent_embedding_whatever_its_pixels(rig_stats) -> None:
    policy, batch = policy_and_batch(rig_stats)
    absent = dict(batch, obs_valid_camera2=torch.zeros_like(batch["obs_valid_camera2"]))
    noise = dict(
        absent, obs_images_camera2=torch.randint(0, 256, batch["obs_images_camera2"].shape, dtype=torch.uint8)
    )
    torch.testing.assert_close(policy.condition(absent), policy.condition(noise), rtol=0, atol=0)
    black = dict(batch, obs_images_camera2=torch.zeros_like(batch["obs_images_camera2"]))
    black["obs_valid_camera2"] = torch.ones_like(batch["obs_valid_camera2"])
    # The absent embedding is not what a black image encodes to.
    assert not torch.allclose(policy.condition(absent), policy.condition(black))


def test_one_encoder_may_serve_every_camera(rig_stats) -> None:
    own, _ = policy_and_batch(rig_stats)
    shared, batch = policy_and_batch(rig_stats, shared=True)
    assert not hasattr(shared, "camera_encoders")
    encoder = sum(p.numel() for p in own.encoder.parameters())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(own) - count(shared) == 2 * encoder
    assert shared.predict_action({k: v for k, v in batch.items() if k != "action"}).shape[-1] == 20


def test_training_on_a_rig_learns_and_resumes_exactly(rig_stats, tmp_path: Path) -> None:
    store, stats_path = rig_stats
    import json

    stats = json.loads(stats_path.read_text())
    result = train(
        store=store, stats=stats, stats_sha256="d" * 64, config=RIG_CONFIG, run_dir=tmp_path / "run"
    )
    assert (result.policy.config.grippers, result.policy.config.cameras) == (2, 3)
    assert result.best_executed is not None and np.isfinite(result.best_executed["score"])
    report = run_smoke(store, stats_path, RIG_CONFIG, steps=4)
    assert report.ok, report.problems


def test_grippers_and_cameras_are_the_datasets_never_params() -> None:
    with pytest.raises(ConfigError, match=r"train.model.cameras is the dataset's \(convert.grippers"):
        train_config_from_params({"model": {"cameras": 2}}, {})
