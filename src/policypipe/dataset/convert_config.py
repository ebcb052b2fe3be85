"""The `convert` section of params.yaml: what a recording's streams become in the dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policypipe.cluster.resources import SlurmArrayConfig
from policypipe.recordings.messages import Topics


@dataclass(frozen=True)
class ConvertConfig:
    """`convert` section of params.yaml."""

    # Which stream feeds which key.
    topics: Topics = Topics()
    # The grippers and cameras the dataset keeps, by number (recording-format.md, "Version 2");
    # gripper 0 and camera 0 (its wrist camera: the dataset's clock) always.
    grippers: tuple[int, ...] = (0,)
    cameras: tuple[int, ...] = (0,)
    # Camera k >= 1: its frame nearest each of camera 0's, kept when at most this far in time.
    max_camera_offset_ms: float = 40.0
    # A kept camera absent from a recording, or without a frame near more than
    # max_undecodable_fraction of its rows: "exclude" the recording, or "mask" those rows.
    on_missing_camera: Literal["exclude", "mask"] = "exclude"
    # (width, height) of the stored frames; resized with area averaging (suited to downscaling).
    image_size: tuple[int, int] = (96, 96)
    # Frames are stored as JPEG (docs/dataset.md, "Image codec").
    jpeg_quality: int = 95
    # Resample every episode onto this grid (Hz); null keeps the camera's own clock.
    resample_hz: float | None = None
    # An episode whose measured frequency differs from the dataset's by more than this
    # fraction fails the stage (unless resample_hz is set).
    frequency_tolerance: float = 0.05
    # More undecodable frames than this fraction excludes the episode.
    max_undecodable_fraction: float = 0.05
    # VIO tracking loss: |q| off by more than this, or faster motion than a hand can make.
    quaternion_norm_tolerance: float = 0.01
    max_speed_m_s: float = 3.0
    max_angular_speed_deg_s: float = 1000.0
    on_tracking_loss: Literal["trim", "exclude"] = "trim"
    # Episodes with fewer kept frames are excluded.
    min_frames: int = 32
    # Parallel conversion processes (0: all cores).
    workers: int = 0
    # local: a process pool on this machine; slurm: array tasks on the cluster (`slurm`), which
    # fill the same cache. Neither changes the output.
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmArrayConfig = SlurmArrayConfig()

    def __post_init__(self) -> None:
        for name in ("grippers", "cameras"):
            numbers = tuple(getattr(self, name))
            object.__setattr__(self, name, numbers)
            # Consecutive from 0: the policy numbers its cameras and grippers by position, so a
            # dataset that skips one (cameras [0, 2]) would feed one camera's frames as another's.
            if list(numbers) != list(range(len(numbers))):
                raise ValueError(
                    f"{name}={list(numbers)}: keep {name} 0 to n in order, e.g. [0] or [0, 1, 2] "
                    f"(gripper 0 and camera 0 are always kept; a dataset that skips one is not supported yet)"
                )
        if not 0 < self.max_camera_offset_ms <= 1000:
            raise ValueError(f"max_camera_offset_ms must be in (0, 1000], got {self.max_camera_offset_ms}")
        w, h = self.image_size
        if not (8 <= w <= 4096 and 8 <= h <= 4096):
            raise ValueError(
                f"image_size must be [width, height] between 8 and 4096, got {list(self.image_size)}"
            )
        if not 50 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be 50..100, got {self.jpeg_quality}")
        if self.resample_hz is not None and not 0 < self.resample_hz <= 1000:
            raise ValueError(f"resample_hz must be in (0, 1000] or null, got {self.resample_hz}")
        for name in ("frequency_tolerance", "max_undecodable_fraction", "quaternion_norm_tolerance"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.max_speed_m_s <= 0 or self.max_angular_speed_deg_s <= 0:
            raise ValueError("max_speed_m_s and max_angular_speed_deg_s must be positive")
        if self.min_frames < 2:
            raise ValueError(f"min_frames must be at least 2, got {self.min_frames}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0: all cores), got {self.workers}")
