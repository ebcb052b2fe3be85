from __future__ import annotations

import pytest

from policypipe.config import ConfigError, from_mapping, require_same_window
from policypipe.recordings.pairing import PairConfig


def test_params_section_becomes_a_typed_frozen_config() -> None:
    config = from_mapping(PairConfig, {"task": "pick_place", "accept_truncated": True}, "pair")
    assert config == PairConfig(task="pick_place", accept_truncated=True)
    with pytest.raises(AttributeError):
        config.task = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"tsak": "x"},
            "unknown key(s) tsak; known keys are: "
            "accept_truncated, aloha, hash_workers, robomimic, source, task",
        ),
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


def test_lists_become_tuples_and_choices_are_checked() -> None:
    from policypipe.dataset.convert_config import ConvertConfig

    config = from_mapping(
        ConvertConfig, {"image_size": [64, 48], "on_tracking_loss": "exclude", "resample_hz": 10}, "convert"
    )
    assert (
        config.image_size == (64, 48) and config.resample_hz == 10.0 and config.on_tracking_loss == "exclude"
    )
    with pytest.raises(ConfigError, match=r"convert.image_size: expected 2 values"):
        from_mapping(ConvertConfig, {"image_size": [64]}, "convert")
    with pytest.raises(ConfigError, match=r"convert.image_size\[1\]: expected an integer"):
        from_mapping(ConvertConfig, {"image_size": [64, "x"]}, "convert")
    with pytest.raises(ConfigError, match=r"'drop' is not one of 'trim', 'exclude'"):
        from_mapping(ConvertConfig, {"on_tracking_loss": "drop"}, "convert")


def test_nested_sections_are_typed_too() -> None:
    from policypipe.dataset.convert_config import ConvertConfig
    from policypipe.recordings.messages import Topics

    config = from_mapping(ConvertConfig, {"topics": {"camera": "/camera0/video"}}, "convert")
    assert config.topics == Topics(camera="/camera0/video")
    with pytest.raises(ConfigError, match=r"convert.topics\]: unknown key\(s\) camrea"):
        from_mapping(ConvertConfig, {"topics": {"camrea": "/x"}}, "convert")


def test_statistics_for_other_windows_are_refused_naming_both() -> None:
    stats = {"window": {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8}}
    require_same_window(stats, {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8}, "params.yaml")
    with pytest.raises(ConfigError, match=r"'horizon': 16.*'horizon': 8.*dvc repro"):
        require_same_window(stats, {"n_obs_steps": 2, "horizon": 8, "n_action_steps": 8}, "params.yaml")
    with pytest.raises(ConfigError, match="None"):
        require_same_window({}, {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8}, "the policy")
