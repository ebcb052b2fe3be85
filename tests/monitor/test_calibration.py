"""The monitor's calibration on the pipeline's own path (sample recordings through convert and stats,
a policy saved as the train stage saves it) and the runner that reads it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from policypipe.dataset.stats import StatsConfig
from policypipe.monitor.calibration import MonitorConfig, TooFewCalibrationValues, calibrate, episode_readings
from policypipe.monitor.scores import MONITOR_JSON, MONITOR_TENSORS, Calibration
from policypipe.policy.export import load_policy
from policypipe.rollout.report import wilson_interval
from policypipe.runtime.observation import Observation
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import RuntimeSpec
from tests.monitor.conftest import CONFIG
from tests.runtime.test_runner import Pipeline, good_observation, tiny_pipeline


def test_the_calibration_is_in_the_policy_folder_and_its_manifest_and_byte_identical_on_a_rerun(
    pipeline,
    monitored,
    tmp_path,
) -> None:
    import json

    manifest = json.loads((monitored / "manifest.json").read_text())
    assert {MONITOR_JSON, MONITOR_TENSORS} <= set(manifest["files"])
    calibration = Calibration.read(monitored)
    assert calibration.false_alarm_rate == 0.2 and calibration.persist == 2
    assert calibration.details["calibration"]["episodes"] == len(pipeline.stats["split"]["val"])
    assert len(calibration.bank.points) <= CONFIG.bank_size
    again = calibrate(
        load_policy(pipeline.policy),
        RuntimeSpec.read(pipeline.policy),
        pipeline.store,
        pipeline.stats["split"],
        CONFIG,
    )
    for name, write in again.files().items():
        write(tmp_path / name)
        assert (tmp_path / name).read_bytes() == (monitored / name).read_bytes(), name
    assert Calibration.read(pipeline.policy) is None  # a policy exported without one


def test_a_policy_that_remembers_its_start_is_calibrated_on_samples_with_their_first_frames(pipeline) -> None:
    from policypipe.policy.diffusion import DiffusionPolicy
    from tests.runtime.test_runner import POLICY

    policy = DiffusionPolicy(dataclasses.replace(POLICY, event_loss_weight=1.0, remember_release=True))
    policy.fit_normalizers(pipeline.stats)
    spec = RuntimeSpec.read(pipeline.policy)
    calibration = calibrate(policy, spec, pipeline.store, pipeline.stats["split"], CONFIG)
    # Its embedding is the whole condition: per observation step the features, pose and width, then
    # the 9 remembered numbers.
    config = policy.config
    assert calibration.bank.points.shape[1] == config.n_obs_steps * (config.image_feature_dim + 10) + 9
    assert math.isfinite(calibration.threshold)


def test_too_few_validation_chunks_for_the_rate_raise_what_the_train_stage_exports_without_a_monitor(
    pipeline,
) -> None:
    # The train stage catches exactly this class (a warning, the policy exported without a monitor);
    # any other error in the calibration fails the stage.
    with pytest.raises(TooFewCalibrationValues, match="stats.val_fraction"):
        calibrate(
            load_policy(pipeline.policy),
            RuntimeSpec.read(pipeline.policy),
            pipeline.store,
            pipeline.stats["split"],
            dataclasses.replace(CONFIG, false_alarm_rate=0.0001),
        )


def test_the_runner_returns_the_same_chunk_with_a_reading_and_the_next_chunk_measures_inconsistency(
    pipeline,
    monitored,
) -> None:
    observation = Observation.checked(**good_observation(pipeline))
    plain, watched = PolicyRunner.load(pipeline.policy), PolicyRunner.load(monitored)
    assert plain.monitor is None and watched.monitor is not None
    start = int(observation.frame_ns[0])
    ours = plain.act(observation, seed=3, episode_start_ns=start)
    theirs = watched.act(observation, seed=3, episode_start_ns=start)
    assert np.array_equal(ours.relative, theirs.relative) and ours.monitor is None
    reading = theirs.monitor
    assert reading.novelty > 0 and math.isnan(reading.inconsistency) and not reading.alarm
    assert theirs.fields()["monitor"] == reading.fields()
    # The same observation a period later (the runner cannot tell): its chunk overlaps the last.
    period = round(1e9 / watched.spec.frequency_hz)
    later = _shifted(observation, period * watched.spec.n_action_steps)
    second = watched.act(later, seed=4, episode_start_ns=start).monitor
    assert second.inconsistency > 0 and second.novelty == pytest.approx(reading.novelty, rel=1e-5)


def _shifted(observation: Observation, ns: int) -> Observation:
    fields = observation.fields()
    for name in ("frame_ns", "pose_ns", "width_ns"):
        fields[name] = fields[name] + ns
    return Observation.checked(**fields)


def _blank(fields: dict) -> dict:
    return fields | {"frames": np.zeros_like(fields["frames"])}


def _shuffled(fields: dict) -> dict:
    frames = fields["frames"]
    pixels = frames.reshape(len(frames), -1, 3)
    order = np.random.default_rng(0).permutation(pixels.shape[1])
    return fields | {"frames": np.ascontiguousarray(pixels[:, order].reshape(frames.shape))}


def _pose_far_outside(fields: dict) -> dict:
    """The gripper 30 cm away a step before t: a jump no recording makes."""
    position = fields["position"].copy()
    position[fields["pose_ns"] < fields["frame_ns"][-1] - 5_000_000] += [0.3, 0.0, 0.0]
    return fields | {"position": position}


@pytest.mark.parametrize(
    "damage", [_blank, _shuffled, _pose_far_outside], ids=["blank", "shuffled", "far_pose"]
)
def test_an_observation_unlike_the_training_data_raises_the_alarm_and_the_recorded_one_does_not(
    pipeline,
    monitored,
    damage,
) -> None:
    runner = PolicyRunner.load(monitored)
    good = good_observation(pipeline)
    period = round(1e9 / runner.spec.frequency_hz) * runner.spec.n_action_steps
    start = int(good["frame_ns"][0])

    def two_chunks(fields: dict, offset: int) -> list:
        observations = [_shifted(Observation.checked(**fields), offset + k * period) for k in range(2)]
        return [
            runner.act(o, seed=k, episode_start_ns=start + offset).monitor for k, o in enumerate(observations)
        ]

    nominal = two_chunks(good, 0)
    strange = two_chunks(damage(good), 10**12)
    assert not any(r.alarm for r in nominal)
    assert strange[1].alarm and strange[1].novelty > nominal[1].novelty


def test_a_policy_without_a_calibration_serves_chunks_without_a_reading(pipeline) -> None:
    chunk = PolicyRunner.load(pipeline.policy).act(Observation.checked(**good_observation(pipeline)))
    assert "monitor" not in chunk.fields()


@pytest.fixture(scope="module")
def ten_recordings(tmp_path_factory) -> Pipeline:
    """Ten sample recordings through convert and stats, and an untrained policy (its embedding is
    what the monitor reads, learned or not)."""
    return tiny_pipeline(tmp_path_factory.mktemp("ten"), 10, 11, StatsConfig())


def test_held_out_nominal_chunks_alarm_at_about_the_calibrated_rate(ten_recordings) -> None:
    """Calibrated on three episodes (the bank from four others), read on three more (nominal too,
    never seen): the share of alarmed chunks is within the binomial interval of the stated rate."""
    store, folder = ten_recordings.store, ten_recordings.policy
    split = {"train": [0, 1, 2, 3], "val": [4, 5, 6]}
    policy, spec = load_policy(folder), RuntimeSpec.read(folder)
    config = MonitorConfig(false_alarm_rate=0.1, neighbours=3, bank_size=512, persist=1)
    calibration = calibrate(policy, spec, store, split, config)
    readings = [
        r for episode in episode_readings(policy, spec, store, [7, 8, 9], calibration, 1) for r in episode
    ]
    alarms = sum(r.alarm for r in readings)
    low, high = wilson_interval(alarms, len(readings))
    print(f"{alarms} of {len(readings)} held-out chunks alarmed, [{low:.3f}, {high:.3f}]")
    assert low <= config.false_alarm_rate <= high, (alarms, len(readings))


def test_the_servers_reply_carries_the_reading_and_a_client_reads_it(pipeline, monitored) -> None:
    from policypipe.serving.client import PolicyClient
    from tests.serving.conftest import serving

    fields = good_observation(pipeline)
    start = int(fields["frame_ns"][0])
    spec = RuntimeSpec.read(monitored)
    period = round(1e9 / spec.frequency_hz) * spec.n_action_steps
    observations = [_shifted(Observation.checked(**fields), k * period) for k in range(2)]
    in_process = PolicyRunner.load(monitored)
    expected = [in_process.act(o, seed=k, episode_start_ns=start).monitor for k, o in enumerate(observations)]
    served_runner = PolicyRunner.load(monitored)
    with serving(served_runner, monitored) as running, PolicyClient(running.url) as client:
        served = [client.act(o, seed=k, episode_start_ns=start).monitor for k, o in enumerate(observations)]
    assert served[0].fields() == expected[0].fields() and served[1].fields() == expected[1].fields()
    assert math.isnan(served[0].inconsistency) and not math.isnan(served[1].inconsistency)
