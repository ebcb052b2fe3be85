from __future__ import annotations

import pytest

from policypipe.config import ConfigError, from_mapping
from policypipe.recordings.pairing import PairConfig


def test_params_section_becomes_a_typed_frozen_config() -> None:
    config = from_mapping(PairConfig, {"task": "pick_place", "accept_truncated": True}, "pair")
    assert config == PairConfig(task="pick_place", accept_truncated=True)
    with pytest.raises(AttributeError):
        config.task = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"tsak": "x"}, "unknown key(s) tsak; known keys are: accept_truncated, hash_workers, task"),
        ({"accept_truncated": "yes"}, "pair.accept_truncated: expected true or false"),
        ({"hash_workers": 1.5}, "pair.hash_workers: expected an integer"),
        ({"hash_workers": -1}, "hash_workers must be >= 0"),
        ({"task": ""}, "task must be a non-empty name"),
    ],
)
def test_a_config_that_cannot_work_is_refused_with_what_to_change(mapping, message) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(PairConfig, mapping, "pair")
    assert message in str(info.value)
