"""The monitor tests' shared fixtures: the runtime tests' tiny pipeline, and its policy with the
monitor calibrated as the train stage calibrates it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from policypipe.monitor.calibration import MonitorConfig, calibrate
from policypipe.policy.export import load_policy, save_policy
from policypipe.runtime.spec import RuntimeSpec
from tests.runtime.test_runner import pipeline  # noqa: F401 (a fixture, by name)

CONFIG = MonitorConfig(false_alarm_rate=0.2, neighbours=3, bank_size=256, persist=2)


@pytest.fixture(scope="module")
def monitored(pipeline, tmp_path_factory) -> Path:  # noqa: F811 (the fixture above)
    """The runtime tests' policy with its monitor calibrated, as the train stage exports it."""
    folder = tmp_path_factory.mktemp("monitored") / "policy"
    policy, spec = load_policy(pipeline.policy), RuntimeSpec.read(pipeline.policy)
    calibration = calibrate(policy, spec, pipeline.store, pipeline.stats["split"], CONFIG)
    save_policy(folder, policy, {"monitor": dataclasses.asdict(CONFIG)}, spec.to_json(), calibration.files())
    return folder
