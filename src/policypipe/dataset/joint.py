"""Joint-space episodes (an ALOHA / RDT source, `recordings.aloha`): per row an absolute joint
vector, the command at that row, and every kept camera's frame, on the rows' own clock.

In the store (`layout`'s joint-space keys; docs/dataset.md, "Joint-space datasets"):
`data/joint_state` (N, D) and `data/joint_action` (N, D) float32, `data/timestamp`,
`data/camera{k}_rgb` (and for k >= 1 `camera{k}_valid`, `camera{k}_offset`, 0: the cameras share the
rows), `meta/episode_ends`; the root attributes name the representation ("joint"), the dimensions
(`joint_names`) and which are grippers (`gripper_joints`). Its training windows:
`dataset.joint_windows`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from policypipe.dataset.convert_cache import camera_prefix
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import decode_frames
from policypipe.recordings.aloha import JointStreams
from policypipe.recordings.messages import RecordingError
from policypipe.recordings.streams import stream_name


@dataclass
class JointEpisode:
    rgb: dict[int, np.ndarray]  # camera k -> uint8 (N, H, W, 3); black where not valid
    valid: dict[int, np.ndarray]  # camera k >= 1 -> bool (N,)
    capture_ns: np.ndarray  # int64 (N,), the kept rows' times
    state: np.ndarray  # float32 (N, D)
    action: np.ndarray  # float32 (N, D)
    frames_in: int
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    camera_topic: str = ""
    camera_topics: dict[int, str] = field(default_factory=dict)  # camera k >= 1: "" when absent


def build_joint_episode(streams: JointStreams, config: ConvertConfig) -> JointEpisode:
    """The episode's rows: those whose camera 0 frame decodes. Another camera's frame that does not
    decode, or a camera the file lacks, marks its rows missing (or excludes the episode, as
    convert.on_missing_camera says)."""
    rows = len(streams.ns)
    camera0 = decode_frames(streams.cameras[0], config.image_size)
    usable = camera0.usable
    reasons = Counter(r for r in camera0.dropped if r is not None)
    if (~usable).sum() > config.max_undecodable_fraction * rows:
        raise RecordingError(
            "undecodable",
            f"{int((~usable).sum())} of {rows} camera 0 frames ({streams.cameras[0].topic}) "
            f"cannot be decoded (the limit, convert.max_undecodable_fraction: "
            f"{config.max_undecodable_fraction})",
        )
    if usable.sum() < config.min_frames:
        raise RecordingError(
            "too_short",
            f"{int(usable.sum())} usable frames, fewer than convert.min_frames = {config.min_frames}",
        )
    rgb, valid, topics, warnings = {0: camera0.rgb[usable]}, {}, {}, []
    for k in config.cameras[1:]:
        name = stream_name("camera", k)
        if k in streams.cameras:
            decoded = decode_frames(streams.cameras[k], config.image_size)
            ok = decoded.usable[usable]
            frames = decoded.rgb[usable]
        else:
            ok, frames = np.zeros(int(usable.sum()), bool), None
        missing = int((~ok).sum())
        if missing > config.max_undecodable_fraction * len(ok):
            detail = (
                f"{name} ({streams.camera_sources.get(k, '')}) has no frame at {missing} of {len(ok)} rows"
            )
            if config.on_missing_camera == "exclude":
                raise RecordingError(
                    "missing_camera" if frames is None else "camera_gaps",
                    f"{detail}; convert.on_missing_camera: mask keeps it with those rows marked",
                )
            warnings.append(f"{detail}: those rows mark it missing")
        w, h = config.image_size
        frames = np.zeros((len(ok), h, w, 3), np.uint8) if frames is None else frames
        frames[~ok] = 0
        rgb[k], valid[k] = frames, ok
        topics[k] = streams.cameras[k].topic if k in streams.cameras else ""
    return JointEpisode(
        rgb=rgb,
        valid=valid,
        capture_ns=streams.ns[usable],
        state=streams.state[usable].astype(np.float32),
        action=streams.action[usable].astype(np.float32),
        frames_in=rows,
        dropped={r: c for r, c in sorted(reasons.items()) if c},
        warnings=warnings,
        camera_topic=streams.cameras[0].topic,
        camera_topics=topics,
    )


def joint_arrays(episode: JointEpisode, jpeg: Callable[..., dict]) -> dict[str, np.ndarray]:
    """The cache entry's arrays: every camera's frames through `jpeg` (prefix -> arrays), the rows."""
    arrays = {"capture_ns": episode.capture_ns, "joint_state": episode.state, "joint_action": episode.action}
    for k, frames in episode.rgb.items():
        prefix = camera_prefix(k)
        arrays |= jpeg(frames, prefix=prefix)
        if k:
            arrays |= {
                f"{prefix}offset_ns": np.zeros(len(frames), np.int64),
                f"{prefix}valid": episode.valid[k],
            }
    return arrays
