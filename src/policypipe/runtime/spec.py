"""What a robot-side runner needs to know about an exported policy, beyond its weights.

Written by the train stage as `runtime.json` in the policy folder (its SHA-256 in the folder's
manifest), from the dataset the policy was trained on: the step rate (measured by `convert`), how
the training frames were made from the cameras', the grippers and cameras it takes and their
topics, how far another camera's frame may lie from camera 0's, the windows, the range of each
gripper's openings it saw, and the conventions of its inputs and outputs.

Format 2 added the grippers, the cameras and the camera offset; format 3 the joints of a
joint-space policy (`dataset.joint`; `runtime.joint_runner` runs it) and the range of each joint's
training commands. Format 1 and 2 files (gripper poses) are still read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RUNTIME_FILE = "runtime.json"
RUNTIME_FORMAT = 3
READABLE_FORMATS = (1, 2, 3)

# How `convert` makes a training frame from a camera frame (dataset.episode.resize_frame and the
# store's JPEG codec): the runner does the same.
RESIZE_METHOD = (
    "cv2.resize to image_size, aspect ratio not kept: INTER_AREA when the width shrinks, INTER_LINEAR "
    "otherwise; then a JPEG round trip at jpeg_quality (the stored frames are JPEG)"
)
CONVENTIONS = {
    "position": "metres, world frame",
    "quaternion": "x, y, z, w (scalar last), world <- gripper, unit norm",
    "time": "integer nanoseconds, capture time, one clock for every stream",
    "image": "RGB uint8, (height, width, 3), the camera's own resolution",
    "action": (
        "step k (0-based) is the target at t + (k + 1) / frequency_hz, t camera 0's latest frame's "
        "capture time: per gripper, position p_t + R_t dp, rotation R_t GramSchmidt(r6), width w_t + dw, "
        "or w_t where 0 < dw < open_deadband_m unless the gripper reports holding nothing"
    ),
    "cameras": (
        "camera 0 sets t and the observation steps; camera k >= 1 gives each step its frame nearest "
        "camera 0's, absent (the policy's learned absent embedding) beyond max_camera_offset_ms or "
        "when not sent"
    ),
}

# A joint-space policy's (`joint_names` given): what differs from the gripper poses above.
JOINT_CONVENTIONS = {
    "joints": "the dataset's units per joint (ALOHA: radians; the gripper's normalised opening), in "
    "joint_names' order; integer nanosecond times on the frames' clock",
    "action": (
        "step k (0-based) is the command for t + k / frequency_hz, t camera 0's latest frame's capture "
        "time: absolute joint positions, clipped to command_ranges (the training commands')"
    ),
    "cameras": CONVENTIONS["cameras"],
}


@dataclass(frozen=True)
class RuntimeSpec:
    frequency_hz: float
    image_size: tuple[int, int]  # (width, height) of the frames the policy was trained on
    jpeg_quality: int
    camera_topics: tuple[str, ...]  # the topics the training episodes' frames came from, every camera
    n_obs_steps: int
    horizon: int
    n_action_steps: int
    # Per gripper, in `grippers`' order: the training episodes' openings, min and max.
    width_ranges_m: tuple[tuple[float, float], ...]
    dataset_fingerprint: str
    stats_sha256: str
    grippers: tuple[int, ...]  # the grippers the policy observes and drives, by number
    cameras: tuple[int, ...]  # the cameras it sees, camera 0 first
    max_camera_offset_ms: float  # convert's: a camera k >= 1 frame further from camera 0's is absent
    # A joint-space policy (empty: gripper poses): its joints in order, and per joint the training
    # commands' min and max.
    joint_names: tuple[str, ...] = ()
    command_ranges: tuple[tuple[float, float], ...] = ()
    # A step that asks the fingers to open by less than this above their reading at t holds them at
    # the reading (`train.open_deadband_mm`), unless the gripper reports that it holds nothing
    # (`GripperState.holding`); 0 in files written before it.
    open_deadband_m: float = 0.0

    @property
    def joint_space(self) -> bool:
        return bool(self.joint_names)

    @property
    def width_range_m(self) -> tuple[float, float]:
        """Gripper 0's openings (recording format 1's only gripper)."""
        return self.width_ranges_m[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RUNTIME_FORMAT,
            **asdict(self),
            "resize_method": RESIZE_METHOD,
            "conventions": JOINT_CONVENTIONS if self.joint_space else CONVENTIONS,
        }

    @classmethod
    def read(cls, folder: Path) -> RuntimeSpec:
        path = Path(folder) / RUNTIME_FILE
        if not Path(folder).is_dir():
            raise FileNotFoundError(
                f"policy folder {folder} does not exist: train one with `dvc repro train` (it writes "
                "data/policy), or give the path of an exported policy"
            )
        if not path.is_file():
            raise ValueError(
                f"policy {folder} has no {RUNTIME_FILE} (it was exported before policypipe recorded what a "
                "runner needs: the step rate, the image size, the windows): train it again with this "
                "version (`dvc repro train`)"
            )
        raw = json.loads(path.read_text())
        if raw.get("format") not in READABLE_FORMATS:
            raise ValueError(
                f"{path} has format {raw.get('format')}, this version reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))}: train the policy again with this version"
            )
        if raw["format"] == 1:  # one gripper, one camera
            raw |= {
                "width_ranges_m": [raw["width_range_m"]],
                "grippers": [0],
                "cameras": [0],
                "max_camera_offset_ms": 0.0,
            }
        return cls(
            frequency_hz=float(raw["frequency_hz"]),
            image_size=tuple(raw["image_size"]),
            jpeg_quality=int(raw["jpeg_quality"]),
            camera_topics=tuple(raw["camera_topics"]),
            n_obs_steps=int(raw["n_obs_steps"]),
            horizon=int(raw["horizon"]),
            n_action_steps=int(raw["n_action_steps"]),
            width_ranges_m=tuple((float(lo), float(hi)) for lo, hi in raw["width_ranges_m"]),
            dataset_fingerprint=str(raw["dataset_fingerprint"]),
            stats_sha256=str(raw["stats_sha256"]),
            grippers=tuple(int(i) for i in raw["grippers"]),
            cameras=tuple(int(k) for k in raw["cameras"]),
            max_camera_offset_ms=float(raw["max_camera_offset_ms"]),
            joint_names=tuple(str(n) for n in raw.get("joint_names", ())),
            command_ranges=tuple((float(lo), float(hi)) for lo, hi in raw.get("command_ranges", ())),
            open_deadband_m=float(raw.get("open_deadband_m", 0.0)),
        )


def spec_of_training(dataset_attrs: dict[str, Any], stats: dict[str, Any], stats_sha256: str) -> RuntimeSpec:
    """The spec of a policy trained on a dataset (its root attributes) with these statistics."""
    from policypipe.dataset import layout

    window = stats["window"]
    episodes = dataset_attrs[layout.ATTRS_EPISODES]
    grippers = tuple(dataset_attrs[layout.ATTRS_GRIPPERS])
    if "joints" in stats:  # joint space: no gripper pose, the commands' ranges
        commands = stats["lowdim"]["action"]
        width_ranges: tuple[tuple[float, float], ...] = ()
        joint_names = tuple(stats["joints"]["names"])
        command_ranges = tuple((float(lo), float(hi)) for lo, hi in zip(commands["min"], commands["max"]))
    else:
        width = stats["lowdim"]["obs.gripper_width"]
        width_ranges = tuple((float(width["min"][g]), float(width["max"][g])) for g in range(len(grippers)))
        joint_names, command_ranges = (), ()
    topics = {ep["camera_topic"] for ep in episodes} | {
        camera["topic"] for ep in episodes for camera in ep.get("cameras", {}).values() if camera["topic"]
    }
    params = dataset_attrs[layout.ATTRS_PARAMS]
    return RuntimeSpec(
        frequency_hz=float(dataset_attrs[layout.ATTRS_FREQUENCY]),
        image_size=tuple(dataset_attrs[layout.ATTRS_IMAGE_SIZE]),
        jpeg_quality=int(params["jpeg_quality"]),
        camera_topics=tuple(sorted(topics)),
        n_obs_steps=int(window["n_obs_steps"]),
        horizon=int(window["horizon"]),
        n_action_steps=int(window["n_action_steps"]),
        width_ranges_m=width_ranges,
        dataset_fingerprint=str(stats["dataset_fingerprint"]["sha256"]),
        stats_sha256=stats_sha256,
        grippers=grippers,
        cameras=tuple(dataset_attrs[layout.ATTRS_CAMERAS]),
        max_camera_offset_ms=float(params["max_camera_offset_ms"]),
        joint_names=joint_names,
        command_ranges=command_ranges,
    )
