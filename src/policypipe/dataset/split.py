"""The train/validation split: a stable hash of each recording's name decides its side.

Each episode's group (its stem, or its session folder) is hashed with the seed; the group is
held out when the hash, read as a number in [0, 1), is below `val_fraction`. Membership depends
on the group's own name only, so adding or removing recordings never moves an existing episode
to the other side (an index permutation would reshuffle them all), and validation is only
approximately `val_fraction` of the groups. Grouping by session keeps recordings of one session
(same table, light, demonstrator) on one side, so validation measures generalisation to a new
session rather than to a new take of a familiar one.

Both sides must be non-empty. When the hash leaves one side empty (few groups, an extreme
fraction), the group whose hash is closest to the threshold crosses over: the one rule that is
not local to a group, used only for datasets too small to split otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SPLIT_BY = ("recording", "session")

RULE = (
    "a group (split_by) is held out when sha256('<seed>:<group>')'s first 8 bytes, as a fraction of "
    "2^64, are below val_fraction; if that empties a side, the group nearest the threshold crosses over"
)


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


def split_episodes(groups: Sequence[str], seed: int, val_fraction: float) -> tuple[list[int], list[int]]:
    """(train, validation) episode indices, sorted and both non-empty; `groups[i]` is episode i's group."""
    distinct = sorted(set(groups))
    if len(distinct) < 2:
        raise ValueError(
            f"the dataset has {len(groups)} episode(s) in {len(distinct)} group(s); a train/validation "
            "split needs at least 2 (with stats.split_by: session, recordings in at least 2 session "
            "folders; or split by recording)"
        )
    position = {g: group_fraction(seed, g) for g in distinct}
    held_out = {g for g in distinct if position[g] < val_fraction}
    if not held_out:
        held_out = {min(distinct, key=position.__getitem__)}
    elif held_out == set(distinct):
        held_out.remove(max(distinct, key=position.__getitem__))
    train = [i for i, g in enumerate(groups) if g not in held_out]
    val = [i for i, g in enumerate(groups) if g in held_out]
    return train, val
