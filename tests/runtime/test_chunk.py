"""The robot side's rule for a chunk's openings (`runtime.chunk`)."""

from __future__ import annotations

import numpy as np
import pytest

from policypipe.runtime.chunk import held_by_deadband, width_to_send

READING = 0.0203  # a 24.3 mm block held, the pads giving 4 mm


@pytest.mark.parametrize(
    ("target", "holding", "sent"),
    [
        (0.0246, True, READING),  # 4.3 mm above the reading while holding: held (it would let go)
        (0.0300, True, READING),  # 9.7 mm: held
        (0.0304, True, 0.0304),  # 10.1 mm: a real opening, sent (the release at the mark)
        (0.0180, True, 0.0180),  # closing further: sent
        (0.0246, False, 0.0246),  # not holding: every target sent (a missed close reopens)
        (0.0246, None, 0.0246),  # a gripper that reports nothing: the runner's rule alone
    ],
)
def test_a_small_opening_keeps_the_grip_only_while_the_gripper_holds(target, holding, sent) -> None:
    assert width_to_send(target, READING, holding, 0.010) == pytest.approx(sent)


def test_no_deadband_sends_every_target() -> None:
    assert width_to_send(0.0246, READING, True, 0.0) == 0.0246


def test_the_runners_rule_holds_unless_the_gripper_reports_holding_nothing() -> None:
    # Openings from the reading at the chunk's observation: a close, 4 mm and 9.7 mm up, the release.
    opening = np.array([-0.004, 0.004, 0.0097, 0.0101])
    assert held_by_deadband(opening, 0.010, True).tolist() == [False, True, True, False]
    assert held_by_deadband(opening, 0.010, None).tolist() == [False, True, True, False]
    assert not held_by_deadband(opening, 0.010, False).any()  # a missed close reopens
