"""The monitor's scores of one chunk, and the alarm its calibration turns them into.

- **novelty**: how far the observation's embedding (`DiffusionPolicy.condition`: every camera's
  features with the normalised low-dimensional state, as the denoiser receives them) lies from the
  training samples': the mean distance to its `neighbours` nearest of a bank of training embeddings,
  each dimension standardised by the bank's spread, divided by sqrt(D) (an RMS per dimension).
  Nearest neighbours need no training and no assumption about the embedding's shape; a few thousand
  points of ~150 dimensions cost well under a millisecond (docs/runtime.md, "The monitor").
- **inconsistency**: how far the new chunk departs from the previous one where they overlap
  (Sentinel's temporal consistency, with one sample each): the shapes of the two chunks' motion over
  their shared steps, each from its own start, normalised as the policy normalises its actions, the
  root mean square of the difference (`chunk_inconsistency`). Undefined (NaN) for an episode's first
  chunk.
- **score**: the largest of the alarm's scores (`Calibration.alarm_scores`; the demo's: novelty
  alone, chosen on the rollout's choice scenes, docs/rollout.md), each in units of its own
  calibration quantile, then the minimum over the last `persist` chunks (an alarm needs both a high
  score and its persistence), divided by the calibrated threshold: the alarm is score > 1, from the
  `persist`-th chunk of an episode on. Both scores are computed and reported either way.

No randomness: the chunk the runner returns is the same with and without a monitor.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from scipy.spatial.transform import Rotation, Slerp

from policypipe.dataset.windows import relative_poses
from policypipe.monitor.reading import MonitorReading
from policypipe.runtime.chunk import ActionChunk

MONITOR_TENSORS = "monitor.safetensors"
MONITOR_JSON = "monitor.json"
MONITOR_FORMAT = 1
SCORES = ("novelty", "inconsistency")  # what the monitor reads of every chunk


@dataclass(frozen=True)
class EmbeddingBank:
    """Training samples' embeddings, standardised per dimension (mean, scale: the bank's own)."""

    mean: np.ndarray  # (D,) float32
    scale: np.ndarray  # (D,) float32, > 0
    points: np.ndarray  # (M, D) float32, standardised
    neighbours: int

    @classmethod
    def of(cls, embeddings: np.ndarray, neighbours: int) -> EmbeddingBank:
        embeddings = np.asarray(embeddings, np.float32)
        if len(embeddings) <= neighbours:
            raise ValueError(
                f"{len(embeddings)} training embeddings for {neighbours} nearest neighbours: "
                "the monitor needs more training samples than neighbours"
            )
        mean = embeddings.mean(axis=0)
        # A dimension constant over the training samples (an unused feature) must not divide by 0;
        # any departure from its one value is then measured in units of 1e-3.
        scale = np.maximum(embeddings.std(axis=0), 1e-3).astype(np.float32)
        return cls(mean, scale, (embeddings - mean) / scale, neighbours)

    def novelty(self, embeddings: np.ndarray) -> np.ndarray:
        """(B, D) embeddings -> (B,) mean distance to the nearest `neighbours`, per sqrt(dimension)."""
        z = (np.asarray(embeddings, np.float32) - self.mean) / self.scale
        squared = (z * z).sum(axis=1)[:, None] - 2.0 * z @ self.points.T + self._point_norms()[None]
        k = self.neighbours
        nearest = np.partition(np.maximum(squared, 0.0), k - 1, axis=1)[:, :k]
        return np.sqrt(nearest).mean(axis=1) / math.sqrt(self.points.shape[1])

    def _point_norms(self) -> np.ndarray:
        norms = self.__dict__.get("_norms")
        if norms is None:
            norms = (self.points * self.points).sum(axis=1)
            object.__setattr__(self, "_norms", norms)
        return norms


@dataclass(frozen=True)
class Calibration:
    """What turns the scores into an alarm (`monitor.calibration.calibrate` makes it)."""

    bank: EmbeddingBank
    novelty_quantile: float  # q_novelty: the calibration chunks' (1 - alpha) conformal quantile
    inconsistency_quantile: float  # q_inconsistency, likewise
    threshold: float  # of the persistent combined score, likewise
    persist: int  # chunks in a row above the threshold before the alarm
    false_alarm_rate: float  # alpha, per chunk of nominal data
    alarm_scores: tuple[str, ...] = SCORES  # the scores the alarm combines
    details: dict[str, Any] = field(default_factory=dict)  # what it was calibrated on, for people

    def files(self) -> dict[str, Any]:
        """{file name: writer(path)} for the policy folder (`policy.export.save_policy`)."""
        tensors = {
            "bank_mean": self.bank.mean,
            "bank_scale": self.bank.scale,
            "bank_points": self.bank.points,
        }
        scalars = {
            "format": MONITOR_FORMAT,
            "neighbours": self.bank.neighbours,
            "novelty_quantile": self.novelty_quantile,
            "inconsistency_quantile": self.inconsistency_quantile,
            "threshold": self.threshold,
            "persist": self.persist,
            "false_alarm_rate": self.false_alarm_rate,
            "alarm_scores": list(self.alarm_scores),
            "details": self.details,
        }
        text = (json.dumps(scalars, indent=1, sort_keys=True) + "\n").encode()
        return {
            MONITOR_TENSORS: lambda p: save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, p),
            MONITOR_JSON: lambda p: Path(p).write_bytes(text),
        }

    @classmethod
    def read(cls, folder: Path) -> Calibration | None:
        """The policy folder's calibration; None where it has none (a policy exported before the
        monitor, or one it does not cover: joint space, the privileged control)."""
        folder = Path(folder)
        if not (folder / MONITOR_JSON).exists():
            return None
        scalars = json.loads((folder / MONITOR_JSON).read_text())
        if scalars.get("format") != MONITOR_FORMAT:
            raise ValueError(
                f"{folder / MONITOR_JSON} has monitor format {scalars.get('format')}, this version reads "
                f"{MONITOR_FORMAT}: train the policy again (`dvc repro train`)"
            )
        tensors = load_file(folder / MONITOR_TENSORS)
        bank = EmbeddingBank(
            tensors["bank_mean"], tensors["bank_scale"], tensors["bank_points"], int(scalars["neighbours"])
        )
        return cls(
            bank,
            float(scalars["novelty_quantile"]),
            float(scalars["inconsistency_quantile"]),
            float(scalars["threshold"]),
            int(scalars["persist"]),
            float(scalars["false_alarm_rate"]),
            tuple(scalars["alarm_scores"]),
            scalars.get("details", {}),
        )


def combined_score(novelty: float, inconsistency: float, calibration: Calibration) -> float:
    """The alarm's scores each in units of its calibration quantile, the larger (an undefined one
    counts 0)."""
    ratios = {
        "novelty": novelty / calibration.novelty_quantile,
        "inconsistency": 0.0
        if math.isnan(inconsistency)
        else inconsistency / calibration.inconsistency_quantile,
    }
    return max(ratios[name] for name in calibration.alarm_scores)


def chunk_inconsistency(previous: ActionChunk | None, chunk: ActionChunk, normalize) -> float:
    """How far `chunk` departs from `previous` where their steps overlap in time: the previous
    chunk's targets at the new chunk's step times, expressed from the previous chunk's own target at
    the new chunk's observation time (where it expected the gripper to be), against the new chunk's
    relative actions (from where the gripper was); both normalised by `normalize` ((1, H, A)
    relative actions -> the policy's normalised ones, `DiffusionPolicy.normalize_actions`), the root
    mean square of the difference. Interpolated between the previous chunk's steps (positions and
    widths linearly, rotations by slerp). Comparing shapes of motion from each chunk's own start,
    not positions, makes it the same whether the gripper followed the previous chunk (closed loop) or
    a demonstrator's path (the calibration's validation episodes). NaN without a previous chunk, or
    where the new observation or every new step falls outside the previous chunk's span."""
    if previous is None:
        return math.nan
    first, last = previous.time_ns[0], previous.time_ns[-1]
    shared = np.flatnonzero((chunk.time_ns >= first) & (chunk.time_ns <= last))
    if not len(shared) or not first <= chunk.observation_ns <= last:
        return math.nan
    times = (np.concatenate([[chunk.observation_ns], chunk.time_ns[shared]]) - first) / 1e9
    span = (previous.time_ns - first) / 1e9
    theirs = chunk.relative.copy()
    for g, targets in enumerate(previous.grippers.values()):
        position = np.stack([np.interp(times, span, targets.position[:, d]) for d in range(3)], axis=1)
        rotation = Slerp(span, Rotation.from_quat(targets.quaternion))(times).as_matrix()
        width = np.interp(times, span, targets.width)
        relative = relative_poses(position[:1], rotation[:1], position[None, 1:], rotation[None, 1:])[0]
        theirs[shared, 10 * g : 10 * g + 9] = relative
        theirs[shared, 10 * g + 9] = width[1:] - width[0]
    with torch.no_grad():
        ours_normalised = normalize(torch.from_numpy(chunk.relative[None]).float())[0].numpy()
        theirs_normalised = normalize(torch.from_numpy(theirs[None]).float())[0].numpy()
    difference = ours_normalised[shared] - theirs_normalised[shared]
    return float(np.sqrt(np.mean(difference * difference)))


class Monitor:
    """The scores of successive chunks of one episode at a time (`read`); a new episode, a clock
    that goes back or a gap longer than a chunk's horizon starts over (`reset`)."""

    def __init__(self, calibration: Calibration, normalize) -> None:
        self.calibration = calibration
        self.normalize = normalize
        self.reset()

    def reset(self) -> None:
        self.previous: ActionChunk | None = None
        self.episode_start_ns: int | None = None
        self.recent: deque[float] = deque(maxlen=self.calibration.persist)

    def read(
        self, embedding: np.ndarray, chunk: ActionChunk, episode_start_ns: int | None = None
    ) -> MonitorReading:
        """The reading of `chunk`, sampled from `embedding` (1, D)."""
        previous = self.previous
        if (
            episode_start_ns != self.episode_start_ns
            or previous is None
            or chunk.observation_ns <= previous.observation_ns
            or chunk.observation_ns > previous.time_ns[-1]
        ):
            self.reset()
            self.episode_start_ns = episode_start_ns
        novelty = float(self.calibration.bank.novelty(embedding)[0])
        inconsistency = chunk_inconsistency(self.previous, chunk, self.normalize)
        self.recent.append(combined_score(novelty, inconsistency, self.calibration))
        self.previous = chunk
        score = min(self.recent) / self.calibration.threshold
        alarm = len(self.recent) == self.calibration.persist and score > 1.0
        return MonitorReading(novelty, inconsistency, score, bool(alarm))
