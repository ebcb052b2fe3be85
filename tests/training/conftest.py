"""A tiny store with statistics, and a tiny training config that runs in seconds on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.config import PolicyConfig
from policypipe.training.config import TrainConfig
from tests.dataset.conftest import make_store

WINDOW = WindowConfig(n_obs_steps=2, horizon=8, n_action_steps=4)
MODEL = PolicyConfig(
    n_obs_steps=2,
    horizon=8,
    n_action_steps=4,
    image_size=(16, 12),
    crop_size=(14, 10),
    encoder_widths=(16, 32),
    image_feature_dim=16,
    down_dims=(16, 32),
    diffusion_step_embed_dim=16,
    num_inference_steps=4,
)
CONFIG = TrainConfig(
    steps=12,
    batch_size=8,
    lr=1e-3,
    warmup_steps=2,
    num_workers=0,
    val_every=4,
    val_batches=2,
    checkpoint_every=4,
    keep_top_k=2,
    model=MODEL,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    make_store(root / "ds.zarr")
    stats = compute_statistics(
        zarr.open_group(root / "ds.zarr", mode="r"), WINDOW, StatsConfig(val_fraction=0.34)
    )
    stats["dataset_fingerprint"] = {"sha256": "f" * 64}
    write_json_atomic(root / "stats.json", stats)
    return root / "ds.zarr", root / "stats.json"


@pytest.fixture(scope="module")
def joint_dataset(tmp_path_factory) -> tuple[Path, Path]:
    """A joint-space dataset (five ALOHA episodes) with its statistics."""
    from tests.recordings.aloha_files import convert_aloha

    root = tmp_path_factory.mktemp("joint_data")
    store, _ = convert_aloha(root, episodes=5, image_size=MODEL.image_size)
    stats = compute_statistics(zarr.open_group(store, mode="r"), WINDOW, StatsConfig(val_fraction=0.4))
    stats["dataset_fingerprint"] = {"sha256": "f" * 64}
    write_json_atomic(root / "stats.json", stats)
    return store, root / "stats.json"
