"""The observation's checks of times, in process (the server checks its own range on top)."""

from __future__ import annotations

import numpy as np
import pytest

from policypipe.runtime.observation import Observation, ObservationError, checked_times, is_field_name

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def test_times_going_back_by_more_than_half_the_int64_range_are_refused_not_wrapped() -> None:
    # np.diff of these wraps to a positive step: subtracting would let them pass.
    with pytest.raises(ObservationError, match=r"must increase: sample 1"):
        checked_times(np.array([INT64_MAX - 1, INT64_MIN + 1]), "pose_ns")


def test_times_increasing_across_the_whole_int64_range_pass() -> None:
    # np.diff of these wraps to a negative step: subtracting would refuse them.
    assert checked_times(np.array([INT64_MIN, INT64_MAX]), "pose_ns").tolist() == [INT64_MIN, INT64_MAX]


def test_unsigned_times_beyond_int64_are_refused_in_words() -> None:
    with pytest.raises(ObservationError, match="beyond int64"):
        checked_times(np.array([2**64 - 2, 2**64 - 1], dtype=np.uint64), "frame_ns")
    assert checked_times(np.array([1, 2], dtype=np.uint64), "frame_ns").dtype == np.int64


def _gripper_fields(prefix: str = "", holding=None) -> dict:
    fields = {
        f"{prefix}pose_ns": np.array([0, 10, 20]),
        f"{prefix}position": np.zeros((3, 3)),
        f"{prefix}quaternion": np.tile([0.0, 0.0, 0.0, 1.0], (3, 1)),
        f"{prefix}width_ns": np.array([0, 10, 20]),
        f"{prefix}width": np.full(3, 0.02),
    }
    return fields | ({} if holding is None else {f"{prefix}holding": holding})


def _observation(**grippers) -> Observation:
    camera = {"frame_ns": np.array([20]), "frames": np.zeros((1, 8, 8, 3), np.uint8)}
    return Observation.checked(**camera, **grippers)


def test_a_grippers_report_of_a_held_object_travels_with_its_openings() -> None:
    holding = np.array([False, True, True])
    observation = _observation(**_gripper_fields(holding=holding), **_gripper_fields("robot1_", ~holding))
    assert observation.grippers[0].holding_at(9) is False  # the latest report at or before t
    assert observation.grippers[0].holding_at(10) is True
    assert observation.grippers[1].holding_at(25) is False
    assert observation.grippers[0].holding_at(-5) is False  # before the first: the first
    # The names the server's protocol sends, and a gripper that does not report it says nothing.
    assert set(observation.fields()) >= {"holding", "robot1_holding"}
    assert is_field_name("holding") and is_field_name("robot1_holding")
    silent = _observation(**_gripper_fields())
    assert silent.grippers[0].holding_at(20) is None and "holding" not in silent.fields()


@pytest.mark.parametrize(
    "holding", [np.array([0, 1, 1]), np.array([True, False]), np.array([[True, False, True]])]
)
def test_a_held_object_report_not_one_bool_per_opening_is_refused_in_words(holding) -> None:
    with pytest.raises(ObservationError, match=r"holding must be \(3,\) bool.*width_ns"):
        _observation(**_gripper_fields(holding=holding))
