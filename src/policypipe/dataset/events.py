"""Grasps and releases read off a recording's own width stream, and the labels they give every frame.

Every recording says where the gripper grasped and where it released: the fingers close, hold,
open. The pose at those moments, relative to the pose at a frame, is a label of that frame that
no one had to annotate: before a grasp, where the object is and how it is turned, seen from the
gripper; before a release, where it goes. It is what a visuomotor policy's image encoder must
learn and what the diffusion loss alone teaches it poorly (docs/rollout.md, "Teaching the encoder
what the recordings know"), so `train.model.event_loss_weight` trains the encoder on it.

**Events** (`find_events`), on one gripper's width samples of one episode: a zigzag with
hysteresis finds the legs along which the opening moves by at least `MIN_SWING_M` one way without
moving back by as much. A closing leg is a grasp: its time is when the opening first comes within
`SETTLE_M` of the leg's smallest (the fingers have arrived; a held object stops them there). An
opening leg that starts from such a closed opening is a release: its time is the last moment the
opening is still within `SETTLE_M` of the closed one. So is a recording's one movement when it is an
opening: it began with the fingers closed on what it lets go (a correction taken over mid-carry,
`policypipe corrections`), and has a release without a grasp. Times are interpolated linearly between
width samples, on the episode clock. The rule reads widths only: it does not know whether the
fingers held something (a close on nothing is a grasp too), which the labels do not need.

**Labels** (`event_labels`), at each frame (row) of the dataset, per gripper g:
  next_grasp    (N, 9 G)  the gripper's pose at its next grasp after the frame, in the frame's
                          gripper frame: position (3, m) and the 6D rotation (6), as the policy's
                          relative poses (`windows.relative_poses`)
  next_release  (N, 9 G)  likewise at its next release
  valid         (N, 2 G)  whether there is a next grasp / next release (after the last one: none)
The poses at the events are interpolated from the recorded pose stream at the event times, as
convert interpolates poses at frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.episode import PoseInterpolator
from policypipe.dataset.windows import POSE_DIM, episode_bounds, relative_poses

# A close or an open moves the fingers by at least this much (a tremor of the width reading, or a
# squeeze of compliant pads, moves them by far less; a real grasp of anything by far more).
MIN_SWING_M = 0.010
# The fingers have arrived when within this of where a leg ends (real width encoders read to about
# 0.1 mm; compliant pads settle by about a millimetre).
SETTLE_M = 0.002

# The batch keys of the labels (`WindowDataset` row features) and the statistics entries they are
# normalised with (`stats.json` lowdim).
NEXT_GRASP, NEXT_RELEASE, VALID = "event_next_grasp", "event_next_release", "event_valid"
STATS_ENTRIES = {NEXT_GRASP: "event.next_grasp", NEXT_RELEASE: "event.next_release"}


@dataclass(frozen=True)
class Events:
    """One gripper's grasps and releases in one episode, seconds on the episode clock, ascending."""

    grasp_s: tuple[float, ...]
    release_s: tuple[float, ...]

    def to_json(self) -> dict[str, list[float]]:
        return {
            "grasp_s": [round(t, 6) for t in self.grasp_s],
            "release_s": [round(t, 6) for t in self.release_s],
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Events:
        return cls(tuple(record["grasp_s"]), tuple(record["release_s"]))


def _legs(width: np.ndarray, swing: float) -> list[tuple[int, int]]:
    """The zigzag's legs as (start, end) sample indices: alternately falling and rising, each
    moving by at least `swing`; the last leg may still be moving when the samples end."""
    pivots: list[int] = []
    high = low = 0
    direction = 0  # -1 closing, +1 opening, 0 not yet known
    for i in range(1, len(width)):
        w = width[i]
        if direction <= 0 and w < width[low]:
            low = i
        if direction >= 0 and w > width[high]:
            high = i
        if direction == 0:
            if width[high] - w >= swing and high < i:  # the first leg closes
                pivots, direction, low = [high], -1, i
            elif w - width[low] >= swing and low < i:  # the first leg opens
                pivots, direction, high = [low], 1, i
        elif direction < 0 and w - width[low] >= swing:
            pivots.append(low)
            direction, high = 1, i
        elif direction > 0 and width[high] - w >= swing:
            pivots.append(high)
            direction, low = -1, i
    if direction:
        pivots.append(low if direction < 0 else high)
    return list(zip(pivots[:-1], pivots[1:]))


def _crossing(t: np.ndarray, w: np.ndarray, i: int, level: float) -> float:
    """The time the opening crosses `level` between samples i - 1 and i (linear), or sample i's."""
    if i == 0 or w[i] == w[i - 1]:
        return float(t[i])
    alpha = (level - w[i - 1]) / (w[i] - w[i - 1])
    return float(t[i - 1] + np.clip(alpha, 0.0, 1.0) * (t[i] - t[i - 1]))


def find_events(time_s: np.ndarray, width: np.ndarray) -> Events:
    """The grasps and releases in one episode's width samples (`time_s` (W,), `width` (W,) m)."""
    t = np.asarray(time_s, dtype=np.float64)
    w = np.asarray(width, dtype=np.float64).reshape(-1)
    grasps: list[float] = []
    releases: list[float] = []
    legs = _legs(w, MIN_SWING_M)
    for start, end in legs:
        if w[end] < w[start]:  # closing: arrived when first within SETTLE_M of the closed opening
            level = w[end] + SETTLE_M
            first = start + int(np.argmax(w[start : end + 1] <= level))
            grasps.append(_crossing(t, w, first, level))
        # Opening after a close, or as the recording's only movement (it began holding what it lets
        # go): released when last within SETTLE_M of the closed one. An opening before a close is
        # not (a takeover's fingers closed on nothing, opened before the grasp).
        elif grasps or len(legs) == 1:
            level = w[start] + SETTLE_M
            last = start + int(np.flatnonzero(w[start : end + 1] <= level)[-1])
            releases.append(_crossing(t, w, last + 1, level) if last < end else float(t[last]))
    return Events(tuple(grasps), tuple(releases))


def missing_events(events: Events) -> str | None:
    """Why an episode's events cannot label it, or None. A release without a grasp labels it: the
    recording began holding (`find_events`), and only its next-grasp labels are absent."""
    if not events.grasp_s and not events.release_s:
        return f"its gripper width never closes by {MIN_SWING_M * 1000:.0f} mm or more: no grasp"
    if not events.release_s:
        return f"its gripper never opens by {MIN_SWING_M * 1000:.0f} mm or more after closing: no release"
    return None


def dataset_events(root: zarr.Group) -> dict[str, Any]:
    """Every episode's events, per kept gripper, as `stats.json` keeps them: {"rule": ...,
    "episodes": [{"stem": ..., "grippers": [Events.to_json(), ...], "missing": reason or null}]}.
    A joint-space dataset has no poses to label with: {}."""
    attrs = root.attrs
    if layout.is_joint_space(attrs):
        return {}
    grippers = list(attrs[layout.ATTRS_GRIPPERS])
    stems = [record["stem"] for record in attrs[layout.ATTRS_EPISODES]]
    per_gripper = []
    for g in grippers:
        first, last = episode_bounds(root[layout.width_episode_ends(g)][:])
        times, widths = root[layout.width_timestamp(g)][:], root[layout.width(g)][:, 0]
        per_gripper.append([find_events(times[a : b + 1], widths[a : b + 1]) for a, b in zip(first, last)])
    episodes = []
    for e, stem in enumerate(stems):
        events = [per_gripper[k][e] for k in range(len(grippers))]
        reasons = [
            (f"gripper {g}: " if len(grippers) > 1 else "") + reason
            for g, ev in zip(grippers, events)
            if (reason := missing_events(ev))
        ]
        episodes.append(
            {
                "stem": stem,
                "grippers": [ev.to_json() for ev in events],
                "missing": "; ".join(reasons) or None,
            }
        )
    return {
        "rule": f"a close or an open moves the fingers by >= {MIN_SWING_M} m; arrived within {SETTLE_M} m",
        "episodes": episodes,
    }


def event_labels(root: zarr.Group, events: dict[str, Any]) -> dict[str, np.ndarray]:
    """{NEXT_GRASP: (N, 9 G) float32, NEXT_RELEASE: (N, 9 G) float32, VALID: (N, 2 G) bool}: each
    row's labels from `events` (`dataset_events`, as stats.json holds them); an invalid label is 0."""
    grippers = list(root.attrs[layout.ATTRS_GRIPPERS])
    frame_time = root[layout.TIMESTAMP][:]
    first, last = episode_bounds(root[layout.EPISODE_ENDS][:])
    records = events["episodes"]
    if len(records) != len(first):
        raise ValueError(
            f"the events are of {len(records)} episodes, the dataset has {len(first)}: "
            "rerun `dvc repro stats`"
        )
    n, gs = len(frame_time), len(grippers)
    out = {
        NEXT_GRASP: np.zeros((n, POSE_DIM * gs), np.float32),
        NEXT_RELEASE: np.zeros((n, POSE_DIM * gs), np.float32),
        VALID: np.zeros((n, 2 * gs), bool),
    }
    for k, g in enumerate(grippers):
        frame_pos = root[layout.eef_pos(g)][:].astype(np.float64)
        frame_rot = Rotation.from_rotvec(root[layout.eef_rot(g)][:].astype(np.float64)).as_matrix()
        p_first, p_last = episode_bounds(root[layout.pose_episode_ends(g)][:])
        pose_t, pose_pos, pose_rot = (
            root[key][:] for key in (layout.pose_timestamp(g), layout.pose_pos(g), layout.pose_rot(g))
        )
        for e, (a, b) in enumerate(zip(first, last)):
            span = slice(p_first[e], p_last[e] + 1)
            interpolate = PoseInterpolator(pose_t[span], pose_pos[span], Rotation.from_rotvec(pose_rot[span]))
            ev = Events.from_json(records[e]["grippers"][k])
            rows = np.arange(a, b + 1)
            for column, (key, times) in enumerate(((NEXT_GRASP, ev.grasp_s), (NEXT_RELEASE, ev.release_s))):
                if not times:
                    continue
                times_arr = np.clip(np.asarray(times), pose_t[span][0], pose_t[span][-1])
                nxt = np.searchsorted(times_arr, frame_time[rows], side="right")  # first event after
                has = nxt < len(times_arr)
                if not has.any():
                    continue
                pos, rot = interpolate(times_arr)
                chosen = rows[has]
                rel = relative_poses(
                    frame_pos[chosen],
                    frame_rot[chosen],
                    pos[nxt[has]][:, None],
                    rot.as_matrix()[nxt[has]][:, None],
                )[:, 0]
                out[key][chosen, POSE_DIM * k : POSE_DIM * (k + 1)] = rel
                out[VALID][chosen, 2 * k + column] = True
    return out


def label_statistics(labels: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per-dimension count, min, max, mean and std of the valid labels at `rows` (the training
    episodes' frames), as stats.json's `events.labels` holds them (the policy normalises its targets
    with them)."""
    out = {}
    gs = labels[VALID].shape[1] // 2
    for column, key in enumerate((NEXT_GRASP, NEXT_RELEASE)):
        per_dim = []
        for k in range(gs):
            valid = labels[VALID][rows, 2 * k + column]
            per_dim.append(labels[key][rows[valid], POSE_DIM * k : POSE_DIM * (k + 1)].astype(np.float64))
        count = min(len(x) for x in per_dim)
        if count == 0:
            continue
        values = [np.concatenate([x.min(0), x.max(0), x.mean(0), x.std(0)]).reshape(4, -1) for x in per_dim]
        stacked = np.concatenate(values, axis=1)
        out[STATS_ENTRIES[key]] = {
            "count": int(count),
            "min": stacked[0].tolist(),
            "max": stacked[1].tolist(),
            "mean": stacked[2].tolist(),
            "std": stacked[3].tolist(),
        }
    return out


# What a refusal of the grasp and release labels offers besides fixing the data: the demo's params
# weigh them, pretrain the encoder on them and freeze it, so all four settings go (a dataset without
# the labels, a joint-space policy, the privileged control).
WITHOUT_THE_LABELS = (
    "train without the labels: train.model.event_loss_weight 0, train.model.event_loss_near_m 0, "
    "train.encoder_pretrain_steps 0 and train.freeze_encoder false"
)


def require_events(stats: dict[str, Any], episodes: list[int]) -> None:
    """Refuses, naming them and why, `episodes` without a grasp or a release in the events that the
    statistics hold: a label the event loss would train towards does not exist there."""
    if "events" not in stats:
        raise ValueError(
            "the statistics hold no grasp and release events (a joint-space dataset, or statistics made "
            f"before this version): rerun `dvc repro stats`, or {WITHOUT_THE_LABELS}"
        )
    records = stats["events"]["episodes"]
    missing = [f"{records[e]['stem']} ({records[e]['missing']})" for e in episodes if records[e]["missing"]]
    if missing:
        raise ValueError(
            f"train.model.event_loss_weight trains on each recording's grasps and releases, and "
            f"{len(missing)} of the training and validation recordings have none: "
            f"{'; '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Leave them out of the export "
            f"(or fix their width stream), or {WITHOUT_THE_LABELS}"
        )


def training_labels(store, stats: dict[str, Any], episodes: list[int]) -> dict[str, np.ndarray]:
    """The per-row labels (`event_labels`) of the dataset at `store` from the events its statistics
    hold, once `require_events` accepts the `episodes` trained and validated on."""
    require_events(stats, episodes)
    return event_labels(zarr.open_group(store, mode="r"), stats["events"])
