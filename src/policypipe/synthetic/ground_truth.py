"""What a sample export's recordings are, apart from their files: each one's random draws and the
demonstrator's plan (the scene, the motion, the block), from the export's seed and the recording's
number alone. `export` writes the recordings from these; `privileged` reads the ground truth back
from them, without the renderer or the MCAP writers.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

import numpy as np

from policypipe.synthetic.motion import MotionPlan, plan_motion

# The first recording of seed 0 starts here; other seeds start on other days.
BASE_TIME_UTC = (2026, 11, 3, 9, 0, 0)
RECORDING_SPACING_S = 150  # one demonstration every two and a half minutes


def base_ns(seed: int) -> int:
    # A fixed date per seed, never the wall clock: seed 0 starts 2026-11-03 09:00 UTC.
    return (calendar.timegm((*BASE_TIME_UTC, 0, 0, 0)) + (seed % 1000) * 86_400) * 1_000_000_000


@dataclass
class RecordingDraws:
    """Recording `index`'s random draws, from SeedSequence([seed, index]) alone: independent of
    scheduling, and the same whichever of its files are written or read back."""

    start_ns: int
    plan: np.random.Generator  # the scene and the demonstrator's motion (after start_ns's draw)
    recovery: np.random.Generator
    hand: np.random.Generator  # a person's hand (`motion.PersonsHand`)
    timing: np.random.SeedSequence
    sim: np.random.SeedSequence
    status: np.random.SeedSequence

    @classmethod
    def of(cls, seed: int, index: int) -> RecordingDraws:
        # A fifth child for the recovery draws and a sixth for the person's hand: the first four, and so
        # the scenes, timings and everything else of a recording, are the same with or without them.
        plan_seq, timing_seq, sim_seq, status_seq, recovery_seq, hand_seq = np.random.SeedSequence(
            [seed, index]
        ).spawn(6)
        plan_rng = np.random.default_rng(plan_seq)
        start_ns = (
            base_ns(seed)
            + index * RECORDING_SPACING_S * 1_000_000_000
            + int(plan_rng.integers(0, 60_000)) * 1_000_000
        )
        return cls(
            start_ns,
            plan_rng,
            np.random.default_rng(recovery_seq),
            np.random.default_rng(hand_seq),
            timing_seq,
            sim_seq,
            status_seq,
        )

    def single_plan(self, recovery: float, hand: float = 0.0) -> MotionPlan:
        """The single gripper's demonstration, a recovery one with probability `recovery` and a
        person's hand's with probability `hand` (draws from `plan`, `recovery` and `hand`: call it
        once)."""
        strays = recovery > 0.0 and self.recovery.random() < recovery
        persons = hand > 0.0 and self.hand.random() < hand
        return plan_motion(
            self.plan,
            self.start_ns,
            recovery_rng=self.recovery if strays else None,
            hand_rng=self.hand if persons else None,
        )


def recording_plan(
    stem: str, *, seed: int, recordings: int, recovery: float, hand: float = 0.0
) -> MotionPlan:
    """The ground truth of the good recording `stem` (rec_0001, ...) of a one-gripper sample export
    of `recordings` recordings with `seed`, `recovery` and `hand` (`export.SampleConfig`): the
    demonstrator's motion, the scene and the block, exactly as `write_sample_export` drew them."""
    match = re.fullmatch(r"rec_([0-9]{4,})", stem)
    if match is None or not 1 <= int(match[1]) <= recordings:
        raise ValueError(
            f"{stem!r} is not a good recording of a sample export of {recordings} recordings "
            f"(rec_0001 .. rec_{recordings:04d})"
        )
    return RecordingDraws.of(seed, int(match[1]) - 1).single_plan(recovery, hand)
