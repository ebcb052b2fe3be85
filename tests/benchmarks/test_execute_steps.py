"""The copy that executes another number of each chunk's steps (`execute_steps`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policypipe.runtime.runner import PolicyRunner
from tests.benchmarks.execute_steps import executing
from tests.runtime.test_runner import pipeline, validation_observation  # noqa: F401 (a fixture, by name)


def test_the_copy_executes_the_steps_asked_with_the_same_weights_and_says_so(pipeline, tmp_path) -> None:  # noqa: F811
    original = PolicyRunner.load(pipeline.policy)
    horizon = original.spec.horizon
    copy = PolicyRunner.load(executing(pipeline.policy, tmp_path / "copy", horizon))
    assert copy.spec.n_action_steps == copy.policy.config.n_action_steps == horizon
    state = copy.policy.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in original.policy.state_dict().items())
    observation, start = validation_observation(pipeline)
    ours, theirs = (r.act(observation, seed=0, episode_start_ns=start) for r in (original, copy))
    np.testing.assert_array_equal(ours.relative, theirs.relative)  # the same chunk ...
    assert theirs.execute.sum() == horizon > ours.execute.sum()  # ... more of it executed
    with pytest.raises(ValueError, match="n_action_steps must be in 1..horizon"):
        executing(pipeline.policy, tmp_path / "too_many", horizon + 1)


def test_the_copy_holds_the_grip_with_the_deadband_asked_and_names_the_trained(pipeline, tmp_path) -> None:  # noqa: F811
    original = PolicyRunner.load(pipeline.policy)
    steps = original.spec.n_action_steps
    folder = executing(pipeline.policy, tmp_path / "wide", steps, open_deadband_mm=25.0)
    copy = PolicyRunner.load(folder)
    assert copy.spec.open_deadband_m == 0.025 != original.spec.open_deadband_m
    assert copy.spec.n_action_steps == steps
    lineage = json.loads((folder / "manifest.json").read_text())["lineage"]
    assert lineage["open_deadband_m_trained"] == original.spec.open_deadband_m
    with pytest.raises(ValueError, match="open_deadband_mm must be >= 0"):
        executing(pipeline.policy, tmp_path / "negative", steps, open_deadband_mm=-1.0)
