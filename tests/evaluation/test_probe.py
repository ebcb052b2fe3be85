"""The encoder probe: the recordings' own grasp and release labels regressed on the image features."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import events
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import rot6d
from policypipe.evaluation import probe
from policypipe.policy.diffusion import DiffusionPolicy
from tests.dataset.conftest import make_store
from tests.training.conftest import MODEL, WINDOW


def test_pose_errors_are_the_distance_and_the_angle_between_the_poses() -> None:
    turned = Rotation.from_euler("z", [[0.0], [30.0], [-90.0]], degrees=True).as_matrix()
    predicted = np.concatenate([np.zeros((3, 3)), rot6d(turned)], axis=1)
    recorded = np.concatenate([[[0.003, 0.004, 0.0]] * 3, rot6d(np.eye(3)[None].repeat(3, 0))], axis=1)
    position_mm, rotation_deg = probe.pose_errors(predicted, recorded)
    np.testing.assert_allclose(position_mm, 5.0)
    np.testing.assert_allclose(rotation_deg, [0.0, 30.0, 90.0], atol=1e-6)


def test_the_ridge_probe_recovers_what_the_features_hold_and_nothing_they_do_not() -> None:
    rng = np.random.default_rng(0)
    labels = rng.normal(size=(600, 9))
    mixing = rng.normal(size=(9, 32))
    holding = labels @ mixing + 0.01 * rng.normal(size=(600, 32))  # the labels, linearly mixed
    blind = rng.normal(size=(600, 32))  # nothing of them
    for features, bound in ((holding, 0.05), (blind, None)):
        fit = probe.ridge(features[:400], labels[:400])
        error = np.abs(probe.ridge_predict(fit, features[400:]) - labels[400:]).mean()
        if bound is None:
            assert error > 0.7  # about the labels' own spread: what predicting their mean gives
        else:
            assert error < bound


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, dict]:
    store = tmp_path_factory.mktemp("probe") / "ds.zarr"
    make_store(store, lengths=(150, 130, 160, 140, 135, 155))
    stats = compute_statistics(zarr.open_group(store, mode="r"), WINDOW, StatsConfig(val_fraction=0.34))
    return store, json.loads(json.dumps(stats))


@pytest.mark.parametrize("event_loss_weight", [0.0, 1.0])
def test_the_probe_judges_every_labelled_held_out_frame_and_a_policys_own_event_head(
    dataset, event_loss_weight: float
) -> None:
    store, stats = dataset
    torch.manual_seed(0)
    policy = DiffusionPolicy(replace(MODEL, event_loss_weight=event_loss_weight))
    policy.fit_normalizers(stats)
    held_out = stats["split"]["val"]
    report = probe.encoder_probe(policy, store, stats, held_out)

    rows, start = probe.rows_of(zarr.open_group(store, mode="r"), held_out)
    labels = events.event_labels(zarr.open_group(store, mode="r"), stats["events"])
    for column, name in enumerate(("next_grasp", "next_release")):
        valid = labels[events.VALID][rows, column]
        assert report[name]["held_out"]["all"]["frames"] == valid.sum()
        assert report[name]["held_out"]["start"]["frames"] == (valid & start).sum()
        assert ("event_head_held_out" in report[name]) == (event_loss_weight > 0)
    assert probe.encoder_probe(policy, store, stats, held_out) == report  # the same bytes each run


def test_no_labels_no_probe(dataset) -> None:
    store, stats = dataset
    policy = DiffusionPolicy(MODEL)
    policy.fit_normalizers(stats)
    without = {k: v for k, v in stats.items() if k != "events"}
    assert "not_run" in probe.encoder_probe(policy, store, without, stats["split"]["val"])
