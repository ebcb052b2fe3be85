"""A rig policy (two grippers, three cameras) served: every camera and gripper travels, every
gripper's targets come back, equal to the runner's in process."""

# ruff: noqa: F811 - the fixtures imported below are the arguments of the test

from __future__ import annotations

import numpy as np

from policypipe.runtime.observation import Observation
from policypipe.serving.client import PolicyClient, RemoteObservationError
from tests.dataset.test_rig import rig_dataset, rig_export  # noqa: F401 - fixtures
from tests.runtime import test_rig_runtime as rig_runtime
from tests.runtime.test_rig_runtime import rig_policy, rig_runner  # noqa: F401 - fixtures
from tests.serving.conftest import serving
from tests.training.test_rig_training import rig_stats  # noqa: F401 - a fixture


def test_a_served_rig_chunk_holds_every_grippers_targets_as_in_process(
    rig_export,
    rig_dataset,
    rig_runner,
    rig_policy,  # noqa: F811
) -> None:
    record, _, _, fields = rig_runtime.one_anchor(rig_export, rig_dataset)
    expected = rig_runner.act(Observation.checked(**fields), seed=5, episode_start_ns=record["start_ns"])
    with serving(rig_runner, rig_policy) as running, PolicyClient(running.url) as client:
        assert "robot1_quaternion" in client.metadata["request"]["fields"]
        assert "camera2_frames" in client.metadata["request"]["fields"]
        served = client.act(fields, seed=5, episode_start_ns=record["start_ns"])
        assert set(served.grippers) == {0, 1}
        for g in (0, 1):
            for part in ("position", "quaternion", "width"):
                assert np.array_equal(getattr(served.grippers[g], part), getattr(expected.grippers[g], part))
        assert np.array_equal(served.relative, expected.relative)
        without = {k: v for k, v in fields.items() if not k.startswith("robot1_")}
        try:
            client.act(without)
        except RemoteObservationError as exc:
            assert "lacks gripper 1" in str(exc)
        else:
            raise AssertionError("an observation without gripper 1 was served")
