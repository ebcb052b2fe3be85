"""The observation's checks of times, in process (the server checks its own range on top)."""

from __future__ import annotations

import numpy as np
import pytest

from policypipe.runtime.observation import ObservationError, checked_times

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
