"""The privileged control's scene state: from a sample export's ground truth in training, from the
simulator in a rollout, the same numbers for the same moment, and refused where it does not exist."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.policy.export import load_policy, save_policy
from policypipe.rollout.episode import RolloutConfig, rollout_scene, run_episode
from policypipe.rollout.references import DemonstrationReplay
from policypipe.runtime.observation import ObservationError
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import spec_of_training
from policypipe.synthetic.ground_truth import recording_plan
from policypipe.synthetic.privileged import (
    SCENE_STATE_DIM,
    dataset_scene_state,
    privileged_training,
    scene_state,
)
from policypipe.training.config import PrivilegedExport
from policypipe.training.loop import train
from tests.runtime.test_runner import POLICY, Pipeline
from tests.training.conftest import CONFIG

# The runtime fixture's export: three recordings of seed 5.
EXPORT = {"seed": 5, "recordings": 3, "recovery": 0.0}


def test_the_block_under_a_gripper_pointing_down_is_ahead_along_its_approach() -> None:
    down = Rotation.from_rotvec([math.pi, 0.0, 0.0]).as_matrix()[None]  # tool z down, tool x = world x
    state = scene_state(
        np.array([[0.1, 0.2, 0.15]]),
        down,
        np.array([[0.1, 0.2, 0.02]]),
        np.array([0.0]),
        np.array([0.4, 0.2]),
    )[0]
    np.testing.assert_allclose(state[:3], [0.0, 0.0, 0.13], atol=1e-12)  # 13 cm down the approach axis
    np.testing.assert_allclose(state[3:5], [1.0, 0.0], atol=1e-12)  # long side along tool x
    np.testing.assert_allclose(state[5:], [0.3, 0.0, 0.15], atol=1e-12)  # the mark 30 cm ahead, on the table
    # A block turned by half a turn looks the same; a quarter turn does not.
    turned = scene_state(
        np.zeros((2, 3)),
        np.repeat(down, 2, 0),
        np.zeros((2, 3)),
        np.array([math.pi, math.pi / 2]),
        np.zeros(2),
    )
    np.testing.assert_allclose(turned[:, 3:5], [[1.0, 0.0], [-1.0, 0.0]], atol=1e-12)


def test_the_dataset_state_is_the_ground_truth_and_the_held_block_stays_between_the_fingers(
    pipeline: Pipeline,
) -> None:
    features = dataset_scene_state(pipeline.store, **EXPORT)
    root = zarr.open_group(pipeline.store, mode="r")
    assert features.shape == (root[layout.TIMESTAMP].shape[0], SCENE_STATE_DIM)
    record = root.attrs[layout.ATTRS_EPISODES][0]
    plan = recording_plan(record["stem"], **EXPORT)
    rows = slice(0, int(root[layout.EPISODE_ENDS][0]))
    t_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][rows] * 1e9).astype(np.int64)
    held = (t_ns >= plan.events_ns["grasp"]) & (t_ns < plan.events_ns["release"])
    assert held.sum() > 10 and (~held).sum() > 10
    # Held, the block moves with the fingers: across them it is centred, and it stays put in the tool frame.
    block = features[rows][held, :3]
    assert np.abs(block[:, 1]).max() < 0.005
    assert np.ptp(block, axis=0).max() < 0.005
    # Before the grasp it lies on the table where the scene put it: its world position, seen back.
    before = np.flatnonzero(~held)[0]
    r = Rotation.from_rotvec(root[layout.EEF_ROT][before].astype(np.float64)).as_matrix()
    world = root[layout.EEF_POS][before].astype(np.float64) + r @ features[before, :3]
    np.testing.assert_allclose(world[:2], plan.scene.target_xy, atol=1e-5)


def test_a_dataset_of_another_export_is_refused_naming_the_episode(pipeline: Pipeline) -> None:
    with pytest.raises(ValueError, match=r"episode session_01/rec_0001 is not recording rec_0001 .* seed 6"):
        dataset_scene_state(pipeline.store, **(EXPORT | {"seed": 6}))
    with pytest.raises(ValueError, match=r"rec_0003.*not a good recording of a sample export of 2"):
        dataset_scene_state(pipeline.store, **(EXPORT | {"recordings": 2}))


def test_the_control_drops_the_image_recipes_grasp_and_release_labels(pipeline: Pipeline) -> None:
    # params.yaml's image recipe (the event loss near the events, the encoder pretrained on the
    # labels and frozen): the control has no encoder to teach, and trains without them.
    recipe = dataclasses.replace(POLICY, event_loss_weight=1.0, event_loss_near_m=0.05)
    export = PrivilegedExport(**EXPORT)
    config = dataclasses.replace(
        CONFIG, model=recipe, encoder_pretrain_steps=4, freeze_encoder=True, privileged=export
    )
    config, _, _ = privileged_training(pipeline.store, pipeline.stats, config)
    assert config.model.scene_state_dim == SCENE_STATE_DIM
    assert not config.model.event_labels and config.model.event_loss_near_m == 0
    assert config.encoder_pretrain_steps == 0 and not config.freeze_encoder


def test_the_control_trains_without_an_image_encoder_and_runs_only_with_the_scene_state(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    config = dataclasses.replace(
        CONFIG, model=POLICY, steps=8, checkpoint_every=4, privileged=PrivilegedExport(**EXPORT)
    )
    config, stats, features = privileged_training(pipeline.store, pipeline.stats, config)
    assert config.model.scene_state_dim == SCENE_STATE_DIM
    result = train(
        store=pipeline.store, stats=stats, stats_sha256="s" * 64, config=config, run_dir=tmp_path / "run",
        row_features=features,
    )  # fmt: skip
    assert result.steps == 8 and math.isfinite(result.last_train_loss)
    assert not hasattr(result.policy, "encoder")
    spec = spec_of_training(dict(zarr.open_group(pipeline.store, mode="r").attrs), stats, "s" * 64)
    save_policy(tmp_path / "policy", result.policy, {}, spec.to_json())
    loaded = load_policy(tmp_path / "policy")
    assert loaded.config.scene_state_dim == SCENE_STATE_DIM
    for key, value in result.policy.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key

    runner = PolicyRunner.load(tmp_path / "policy")
    # Through the rollout's harness, which hands it the simulator's state at each frame.
    outcome = run_episode(runner, 7, RolloutConfig(time_limit_s=1.0, frequency_hz=spec.frequency_hz)).outcome
    assert outcome in ("never_closed_on_block", "closed_on_nothing", "timed_out", "dropped")
    # What a robot has, camera frames without the scene's state, is refused in words.
    plan = rollout_scene(7)
    observation = _still_observation(plan)
    with pytest.raises(ObservationError, match="privileged control"):
        runner.act(observation)


def _still_observation(plan):
    from policypipe.runtime.observation import Observation

    times = plan.start_ns + np.arange(4) * 33_000_000
    position, quaternion = plan.pose_at(times)
    frames = np.zeros((4, 24, 32, 3), np.uint8)
    return Observation.checked(times, frames, times, position, quaternion, times, plan.width_at(times))


def test_the_rollout_hands_the_runner_the_state_training_computes_for_the_same_moment() -> None:
    """The scene's demonstration drives; at every request the harness's scene state at each frame is
    what training computes from the ground truth at that frame's time (the block on the table, then
    in the fingers, then on the mark), seen from the gripper's pose there."""
    plan = rollout_scene(3)
    seen = []

    class Watching(DemonstrationReplay):
        def act(self, observation, now_ns=None, episode_start_ns=None):
            seen.append(observation)
            return super().act(observation, now_ns, episode_start_ns)

    assert run_episode(Watching(plan, 30.0), 3, RolloutConfig()).outcome == "success"
    for observation in seen[1::4]:  # from the second: the first frames are the lead-in's, held still
        after = observation.frame_ns >= plan.start_ns
        t = observation.frame_ns[after]
        position, quaternion = plan.pose_at(t)
        centre, yaw = plan.target_at(t)
        expected = scene_state(
            position, Rotation.from_quat(quaternion).as_matrix(), centre, yaw, plan.scene.place_xy
        )
        # The simulator steps between the demonstration's 30 Hz targets, the plan is continuous; a held
        # block stays where the fingers closed on it in the simulator, the plan's is carried at the
        # TCP itself (3.4 mm apart here), and the closing fingers turned it square where the plan
        # keeps the demonstrator's half a degree off square: the same to within a few millimetres
        # and a degree.
        np.testing.assert_allclose(observation.scene_state[after], expected, atol=1e-2)
    assert len(seen) > 20
