"""The train/validation/test split: a stable hash of each recording's name decides its side.

Each episode's group (its stem, or its session folder) is hashed with the seed into a position
in [0, 1). A group is held out for validation when its position is below `val_fraction`, for
the test side when it lies in [val_fraction, val_fraction + test_fraction), and trains
otherwise. Membership depends on the group's own name only, so adding or removing recordings
never moves an existing episode to another side (an index permutation would reshuffle them
all), and each side is only approximately its fraction of the groups. The validation side is
the one every choice is made on (checkpoint ranking, sweeps, the measured defaults); the test
side is what `eval` reports as the headline, and nothing is chosen on it. A `test_fraction` of
0 leaves no test side (validation then has the same groups as with a two-way split of the same
seed and `val_fraction`). Grouping by session keeps recordings of one session (same table,
light, demonstrator) on one side, so held-out numbers measure generalisation to a new session
rather than to a new take of a familiar one.

Every side with a positive fraction, and training, must be non-empty. When the hash leaves one
empty (few groups, an extreme fraction), the group nearest that side's interval crosses over
from a side that keeps at least one: the one rule that is not local to a group, used only for
datasets too small to split otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

SPLIT_BY = ("recording", "session")

RULE = (
    "a group (split_by) is at position sha256('<seed>:<group>')'s first 8 bytes / 2^64; validation "
    "below val_fraction, test from val_fraction to val_fraction + test_fraction, train above; if that "
    "empties a side, the group nearest the side's interval crosses over"
)


@dataclass(frozen=True)
class Split:
    """Episode indices of each side, sorted; `test` is empty when test_fraction is 0."""

    train: list[int]
    val: list[int]
    test: list[int]


def group_fraction(seed: int, group: str) -> float:
    """The group's position in [0, 1): a pure function of the seed and the group's name."""
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def episode_groups(episodes: Sequence[dict], split_by: str) -> list[str]:
    """The name each episode is split by: its stem, or its session folder ('' at the export's root)."""
    if split_by not in SPLIT_BY:
        raise ValueError(f"split_by must be one of {SPLIT_BY}, got {split_by!r}")
    key = "stem" if split_by == "recording" else "folder"
    missing = [i for i, ep in enumerate(episodes) if key not in ep]
    if missing:
        raise ValueError(
            f"episode records {missing[:5]} have no {key!r}: convert the dataset again with this version "
            f"(records gained the session folder), or split by 'recording'"
        )
    return [str(ep[key]) for ep in episodes]


def split_episodes(
    groups: Sequence[str], seed: int, val_fraction: float, test_fraction: float = 0.0
) -> Split:
    """The sides of the episodes; `groups[i]` is episode i's group."""
    if not (0 < val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction {val_fraction} and test_fraction {test_fraction}: need val_fraction > 0, "
            "test_fraction >= 0 and their sum below 1"
        )
    distinct = sorted(set(groups))
    intervals = {"val": (0.0, val_fraction), "train": (val_fraction + test_fraction, 1.0)}
    if test_fraction > 0:
        intervals["test"] = (val_fraction, val_fraction + test_fraction)
    if len(distinct) < len(intervals):
        sides = "train/validation/test" if test_fraction > 0 else "train/validation"
        raise ValueError(
            f"the dataset has {len(groups)} episode(s) in {len(distinct)} group(s); a {sides} split needs "
            f"at least {len(intervals)} (with stats.split_by: session, recordings in at least "
            f"{len(intervals)} session folders; or split by recording"
            + ("; or set stats.test_fraction: 0 for no test side)" if test_fraction > 0 else ")")
        )
    position = {g: group_fraction(seed, g) for g in distinct}
    side_of = {
        g: next(side for side, (low, high) in intervals.items() if low <= position[g] < high)
        for g in distinct
    }
    for side, (low, high) in intervals.items():
        if side in side_of.values():
            continue
        members = {s: [g for g in distinct if side_of[g] == s] for s in intervals}
        donors = [g for g in distinct if len(members[side_of[g]]) > 1]
        # Distance of a position to the interval [low, high).
        side_of[min(donors, key=lambda g: max(low - position[g], position[g] - high, 0.0))] = side
    return Split(
        *([i for i, g in enumerate(groups) if side_of[g] == side] for side in ("train", "val", "test"))
    )
