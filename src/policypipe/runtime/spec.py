"""What a robot-side runner needs to know about an exported policy, beyond its weights.

Written by the train stage as `runtime.json` in the policy folder (its SHA-256 in the folder's
manifest), from the dataset the policy was trained on: the step rate (measured by `convert`), how
the training frames were made from the camera's, the camera topic, the windows, the range of
gripper openings it saw, and the conventions of its inputs and outputs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RUNTIME_FILE = "runtime.json"
RUNTIME_FORMAT = 1

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
        "step k (0-based) is the target at t + (k + 1) / frequency_hz, t the latest frame's capture "
        "time: position p_t + R_t dp, rotation R_t GramSchmidt(r6), width w_t + dw"
    ),
}


@dataclass(frozen=True)
class RuntimeSpec:
    frequency_hz: float
    image_size: tuple[int, int]  # (width, height) of the frames the policy was trained on
    jpeg_quality: int
    camera_topics: tuple[str, ...]  # the topics the training episodes' frames came from
    n_obs_steps: int
    horizon: int
    n_action_steps: int
    width_range_m: tuple[float, float]  # the training episodes' gripper openings, min and max
    dataset_fingerprint: str
    stats_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RUNTIME_FORMAT,
            **asdict(self),
            "resize_method": RESIZE_METHOD,
            "conventions": CONVENTIONS,
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
        if raw.get("format") != RUNTIME_FORMAT:
            raise ValueError(
                f"{path} has format {raw.get('format')}, this version reads {RUNTIME_FORMAT}: "
                "train the policy again with this version"
            )
        return cls(
            frequency_hz=float(raw["frequency_hz"]),
            image_size=tuple(raw["image_size"]),
            jpeg_quality=int(raw["jpeg_quality"]),
            camera_topics=tuple(raw["camera_topics"]),
            n_obs_steps=int(raw["n_obs_steps"]),
            horizon=int(raw["horizon"]),
            n_action_steps=int(raw["n_action_steps"]),
            width_range_m=tuple(raw["width_range_m"]),
            dataset_fingerprint=str(raw["dataset_fingerprint"]),
            stats_sha256=str(raw["stats_sha256"]),
        )


def spec_of_training(dataset_attrs: dict[str, Any], stats: dict[str, Any], stats_sha256: str) -> RuntimeSpec:
    """The spec of a policy trained on a dataset (its root attributes) with these statistics."""
    from policypipe.dataset import layout

    window = stats["window"]
    width = stats["lowdim"]["obs.gripper_width"]
    episodes = dataset_attrs[layout.ATTRS_EPISODES]
    return RuntimeSpec(
        frequency_hz=float(dataset_attrs[layout.ATTRS_FREQUENCY]),
        image_size=tuple(dataset_attrs[layout.ATTRS_IMAGE_SIZE]),
        jpeg_quality=int(dataset_attrs[layout.ATTRS_PARAMS]["jpeg_quality"]),
        camera_topics=tuple(sorted({ep["camera_topic"] for ep in episodes})),
        n_obs_steps=int(window["n_obs_steps"]),
        horizon=int(window["horizon"]),
        n_action_steps=int(window["n_action_steps"]),
        width_range_m=(float(width["min"][0]), float(width["max"][0])),
        dataset_fingerprint=str(stats["dataset_fingerprint"]["sha256"]),
        stats_sha256=stats_sha256,
    )
