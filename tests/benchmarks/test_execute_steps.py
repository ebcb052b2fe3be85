"""The copy that executes another number of each chunk's steps (`execute_steps`)."""

from __future__ import annotations

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
