"""The joint-space runner against the samples eval draws from the same ALOHA episodes: what a robot
sends (its cameras' frames at their own resolution, its joint vectors) becomes the batch training
saw, and the policy's chunk becomes absolute commands at t + k / f."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.samples import collect_samples
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from policypipe.runtime.joint_runner import JointObservation, JointPolicyRunner, load_runner
from policypipe.runtime.observation import ObservationError
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import RuntimeSpec, spec_of_training
from policypipe.training.config import model_for_dataset
from tests.recordings.aloha_files import CAMERAS, convert_aloha
from tests.training.conftest import MODEL

WINDOW = WindowConfig(2, 8, 4)
PERIOD_NS = 20_000_000  # 50 Hz


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Five ALOHA episodes converted, their statistics, and an untrained joint-space policy saved
    as the train stage saves it (the runner's arithmetic does not depend on what it learned)."""
    root = tmp_path_factory.mktemp("joint_runtime")
    store, written = convert_aloha(root, episodes=5)
    dataset = zarr.open_group(store, mode="r")
    stats = compute_statistics(dataset, WINDOW, StatsConfig(val_fraction=0.4, test_fraction=0.2))
    stats["dataset_fingerprint"] = {"sha256": "d" * 64}
    write_json_atomic(root / "stats.json", stats)
    torch.manual_seed(0)
    policy = DiffusionPolicy(
        model_for_dataset(replace(MODEL, image_size=(20, 16), crop_size=(18, 14)), stats)
    )
    policy.fit_normalizers(stats)
    spec = spec_of_training(dict(dataset.attrs), stats, sha256_file(root / "stats.json"))
    save_policy(root / "policy", policy, {}, spec.to_json())
    return store, root / "policy", stats, written


def robot_observation(
    arrays: dict[str, np.ndarray], row: int, history: int = 3, **changes
) -> JointObservation:
    """What the robot has at `row`: the last `history` frames of cameras 0 and 1 (at their own
    40 x 32 pixels) and joint vectors, times on the file's 50 Hz clock."""
    rows = np.arange(max(row - history + 1, 0), row + 1)
    ns = rows * PERIOD_NS
    fields = {
        "frame_ns": ns,
        "frames": arrays[CAMERAS[0]][rows],
        "camera1_frame_ns": ns,
        "camera1_frames": arrays[CAMERAS[1]][rows],
        "joints_ns": ns,
        "joints": arrays["qpos"][rows],
    }
    return JointObservation.checked(**(fields | changes))


def test_the_runner_sees_what_eval_sees_and_returns_absolute_commands_at_their_times(exported) -> None:
    store, folder, stats, written = exported
    runner = load_runner(folder)
    assert isinstance(runner, JointPolicyRunner)
    samples = collect_samples(store, stats["split"]["val"], WINDOW, stride=6)
    ends = np.concatenate([[0], zarr.open_group(store, mode="r")["meta/episode_ends"][:]])
    for i, (episode, anchor) in enumerate(zip(samples.episodes, samples.anchors)):
        row = int(anchor - ends[episode])
        observation = robot_observation(written[episode], row)
        batch, t = runner.prepare(observation, episode_start_ns=0)
        assert t == row * PERIOD_NS
        # The same frames bit for bit (resized and JPEG round-tripped as convert stored them), and
        # the same joint vectors (float32, as training's batches hold them).
        assert torch.equal(batch["obs_images"][0], samples.batch["obs_images"][i])
        assert torch.equal(batch["obs_images_camera1"][0], samples.batch["obs_images_camera1"][i])
        assert torch.equal(batch["obs_state"][0], samples.batch["obs_state"][i])

        eval_batch = {k: v[i : i + 1] for k, v in samples.batch.items() if k != "action"}
        expected = (
            runner.policy.predict_action(eval_batch, torch.Generator().manual_seed(i))[0].double().numpy()
        )
        chunk = runner.act(observation, seed=i, episode_start_ns=0)
        low, high = np.asarray(runner.spec.command_ranges).T
        np.testing.assert_allclose(chunk.joints, np.clip(expected, low, high), atol=1e-5)
        assert (chunk.time_ns - t).tolist() == [k * PERIOD_NS for k in range(WINDOW.horizon)]
        assert chunk.execute.tolist() == [k < WINDOW.n_action_steps for k in range(WINDOW.horizon)]
        assert chunk.joint_names == tuple(stats["joints"]["names"])


def test_commands_stay_within_the_training_commands_and_past_steps_are_not_executed(exported) -> None:
    _, folder, stats, written = exported
    runner = JointPolicyRunner.load(folder)
    chunk = runner.act(robot_observation(written[0], 10), now_ns=10 * PERIOD_NS + PERIOD_NS, seed=0)
    action = stats["lowdim"]["action"]
    assert (chunk.joints >= np.asarray(action["min"])).all() and (
        chunk.joints <= np.asarray(action["max"])
    ).all()
    assert chunk.past.tolist() == [k <= 1 for k in range(WINDOW.horizon)]
    assert chunk.execute.tolist() == [1 < k < WINDOW.n_action_steps for k in range(WINDOW.horizon)]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"joints": np.zeros((3, 12))}, "joints has 12 columns; the policy takes 14"),
        ({"joints_ns": np.array([0, 20_000_000, 20_000_000])}, "joints_ns must increase"),
        (
            {"camera2_frame_ns": np.array([0]), "camera2_frames": np.zeros((1, 32, 40, 3), np.uint8)},
            "camera 2",
        ),
        ({"qpos": np.zeros((3, 14))}, "unknown observation field 'qpos'"),
    ],
)
def test_a_bad_observation_is_refused_naming_what_is_wrong(exported, changes, says: str) -> None:
    _, folder, _, written = exported
    runner = JointPolicyRunner.load(folder)
    with pytest.raises(ObservationError, match=says):
        runner.act(robot_observation(written[0], 10, **changes))


def test_joint_history_older_than_sent_is_refused(exported) -> None:
    _, folder, _, written = exported
    observation = robot_observation(written[0], 10)
    late = JointObservation(observation.cameras, observation.joints_ns[-1:], observation.joints[-1:])
    with pytest.raises(ObservationError, match="send more joints history"):
        JointPolicyRunner.load(folder).act(late)


def test_each_runner_refuses_the_other_kind_of_policy(exported) -> None:
    _, folder, _, _ = exported
    with pytest.raises(ValueError, match="a joint-space policy .*JointPolicyRunner"):
        PolicyRunner.load(folder)
    spec = RuntimeSpec.read(folder)
    assert spec.joint_space and spec.grippers == () and spec.width_ranges_m == ()
