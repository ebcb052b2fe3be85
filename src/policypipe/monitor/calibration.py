"""The monitor's calibration, made by the train stage from data a team has before any deployment.

The bank: the embeddings of the training episodes' samples (every `stride`-th anchor, the stride
that keeps at most `bank_size`). The thresholds: the validation episodes (never the test side) at
the runner's chunk schedule, one chunk every n_action_steps frames from each episode's first
anchor, each sample built as training builds it (the runner builds the same from a robot's streams,
tests/runtime/test_runner.py) and sampled with a seeded generator; the monitor reads the chunks in
order, as the runner would. Each threshold is the split-conformal quantile of the calibration
chunks' scores at `false_alarm_rate`: the ceil((n + 1)(1 - alpha))-th smallest of n, so that a
new nominal chunk exceeds it with probability at most alpha when the chunks are exchangeable
(Vovk et al.; FAIL-Detect's and FIPER's use). Chunks of one episode are not independent: the
realised rate on held-out episodes scatters more than a binomial's (tests/monitor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig
from policypipe.monitor.scores import (
    Calibration,
    EmbeddingBank,
    Monitor,
    MonitorReading,
    chunk_inconsistency,
    combined_score,
)
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.runtime.chunk import ActionChunk
from policypipe.runtime.spec import RuntimeSpec

NS = 1_000_000_000
BATCH = 64  # samples through the policy at a time


@dataclass(frozen=True)
class MonitorConfig:
    """`monitor` section of params.yaml."""

    false_alarm_rate: float = 0.01  # alpha: of nominal chunks, the share above the threshold
    neighbours: int = 5  # k of the novelty's k nearest training embeddings
    bank_size: int = 4096  # training embeddings kept, at most
    persist: int = 2  # chunks in a row above the threshold before the alarm
    # The scores the alarm combines (each is computed and reported either way).
    alarm_scores: tuple[Literal["novelty", "inconsistency"], ...] = ("novelty",)
    seed: int = 0  # the calibration chunks' sampling noise

    def __post_init__(self) -> None:
        if not 0.0 < self.false_alarm_rate < 1.0:
            raise ValueError(f"monitor.false_alarm_rate must be in (0, 1), got {self.false_alarm_rate}")
        if self.neighbours < 1 or self.bank_size <= self.neighbours or self.persist < 1:
            raise ValueError(
                "monitor.neighbours and persist must be >= 1, bank_size larger than neighbours; got "
                f"{self.neighbours}, {self.persist}, {self.bank_size}"
            )
        if not self.alarm_scores or len(set(self.alarm_scores)) != len(self.alarm_scores):
            raise ValueError(
                "monitor.alarm_scores must name novelty, inconsistency or both, once each; got "
                f"{list(self.alarm_scores)}"
            )


class TooFewCalibrationValues(ValueError):
    """The validation episodes give too few chunks for the stated false-alarm rate (the train stage
    then exports the policy without a monitor, saying so; any other error is a bug and fails it)."""


def conformal_quantile(scores: np.ndarray, alpha: float, what: str) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest of the n `scores`; refused where n is too small for
    alpha (the quantile would be beyond the largest)."""
    scores = np.sort(np.asarray(scores, np.float64)[~np.isnan(scores)])
    rank = math.ceil((len(scores) + 1) * (1.0 - alpha))
    if rank > len(scores):
        raise TooFewCalibrationValues(
            f"{len(scores)} calibration values of {what} cannot give a false-alarm rate of {alpha}: it needs "
            f"at least {math.ceil(1 / alpha) - 1}; raise monitor.false_alarm_rate or validate on more "
            "episodes (stats.val_fraction)"
        )
    return float(scores[rank - 1])


def observations(data: WindowDataset, indices: np.ndarray) -> dict[str, torch.Tensor]:
    """Samples `indices` as the policy's observation batch (no actions)."""
    items = data.__getitems__(indices.tolist())
    return {k: torch.stack([it[k] for it in items]) for k in items[0] if k != "action"}


def embeddings(policy: DiffusionPolicy, data: WindowDataset, indices: np.ndarray) -> np.ndarray:
    """(N, D) the condition of samples `indices` (centre crops: the policy in eval mode)."""
    with torch.no_grad():
        out = [
            policy.condition(observations(data, indices[start : start + BATCH])).numpy()
            for start in range(0, len(indices), BATCH)
        ]
    return np.concatenate(out).astype(np.float32)


def training_bank(
    policy: DiffusionPolicy, store: Path, episodes: list[int], window: WindowConfig, config: MonitorConfig
) -> tuple[EmbeddingBank, int]:
    """The bank of the training episodes' embeddings, and the stride of its anchors."""
    data = WindowDataset(store, episodes, window, episode_start=policy.config.remember_release)
    stride = max(1, math.ceil(len(data) / config.bank_size))
    return EmbeddingBank.of(
        embeddings(policy, data, np.arange(0, len(data), stride)), config.neighbours
    ), stride


def calibrate(
    policy: DiffusionPolicy, spec: RuntimeSpec, store: Path, split: dict[str, Any], config: MonitorConfig
) -> Calibration:
    """The monitor's calibration for `policy`, trained on `split["train"]`, from `split["val"]`."""
    policy = policy.eval()
    window = WindowConfig(spec.n_obs_steps, spec.horizon, spec.n_action_steps)
    bank, stride = training_bank(policy, store, list(split["train"]), window, config)
    episodes = episode_chunks(_runner(policy, spec), store, list(split["val"]), config.seed)
    scores = [raw_scores(episode, bank, policy) for episode in episodes]
    alpha = config.false_alarm_rate
    provisional = Calibration(
        bank,
        conformal_quantile(np.concatenate([n for n, _ in scores]), alpha, "novelty"),
        conformal_quantile(np.concatenate([i for _, i in scores]), alpha, "inconsistency"),
        1.0,
        config.persist,
        alpha,
        tuple(config.alarm_scores),
    )
    persistent = np.concatenate([persistent_scores(n, i, provisional) for n, i in scores])
    threshold = conformal_quantile(persistent, alpha, "the persistent combined score")
    details = {
        "bank": {"episodes": len(split["train"]), "embeddings": len(bank.points), "stride": stride},
        # The trivial monitor's alarm (time since the start, rollout.monitoring): a team's longest
        # nominal episode.
        "validation_longest_s": longest_episode_s(store, list(split["val"])),
        "calibration": {
            "episodes": len(episodes),
            "chunks": int(sum(len(n) for n, _ in scores)),
            "rule": "the validation episodes at the runner's schedule (one chunk every n_action_steps "
            "frames); each threshold the ceil((n + 1)(1 - false_alarm_rate))-th smallest of n",
        },
    }
    return Calibration(
        bank,
        provisional.novelty_quantile,
        provisional.inconsistency_quantile,
        threshold,
        config.persist,
        alpha,
        tuple(config.alarm_scores),
        details,
    )


def longest_episode_s(store: Path, episodes: list[int]) -> float:
    """The longest of `episodes`, first frame to last, seconds."""
    root = zarr.open_group(store, mode="r")
    times, ends = root[layout.TIMESTAMP][:], root[layout.EPISODE_ENDS][:]
    starts = np.concatenate([[0], ends[:-1]])
    return round(max(float(times[ends[e] - 1] - times[starts[e]]) for e in episodes), 3)


def persistent_scores(novelty: np.ndarray, inconsistency: np.ndarray, calibration: Calibration) -> np.ndarray:
    """An episode's persistent combined scores (before the threshold), from its persist-th chunk on."""
    combined = np.array([combined_score(n, i, calibration) for n, i in zip(novelty, inconsistency)])
    p = calibration.persist
    return np.array([combined[j - p + 1 : j + 1].min() for j in range(p - 1, len(combined))])


@dataclass
class EpisodeChunks:
    """An episode's chunks at the runner's schedule, with what the monitor reads of each."""

    episode: int
    conditions: np.ndarray  # (C, D) the embeddings the chunks were sampled from
    chunks: list[ActionChunk]


def raw_scores(
    episode: EpisodeChunks, bank: EmbeddingBank, policy: DiffusionPolicy
) -> tuple[np.ndarray, np.ndarray]:
    """(C,) novelty and (C,) inconsistency of an episode's chunks (NaN for the first)."""
    previous = [None, *episode.chunks[:-1]]
    inconsistency = [
        chunk_inconsistency(p, c, policy.normalize_actions) for p, c in zip(previous, episode.chunks)
    ]
    return bank.novelty(episode.conditions), np.asarray(inconsistency)


def episode_readings(
    policy: DiffusionPolicy,
    spec: RuntimeSpec,
    store: Path,
    episodes: list[int],
    calibration: Calibration,
    seed: int,
) -> list[list[MonitorReading]]:
    """The monitor's readings along each of `episodes` at the runner's schedule, as the runner's
    monitor reads them (what a calibration promises, checked on other episodes)."""
    policy = policy.eval()
    out = []
    for episode in episode_chunks(_runner(policy, spec), store, episodes, seed):
        monitor = Monitor(calibration, policy.normalize_actions)
        out.append(
            [
                monitor.read(episode.conditions[j : j + 1], chunk, episode_start_ns=episode.episode)
                for j, chunk in enumerate(episode.chunks)
            ]
        )
    return out


def _runner(policy: DiffusionPolicy, spec: RuntimeSpec):
    from policypipe.runtime.runner import PolicyRunner  # the runner loads calibrations: imported late

    return PolicyRunner(policy, spec)


def episode_chunks(runner, store: Path, episodes: list[int], seed: int) -> list[EpisodeChunks]:
    """Each episode's chunks at the runner's schedule: one every n_action_steps frames from its first
    anchor, sampled by the runner's policy in batches with one seeded generator, composed onto the
    recorded poses."""
    from policypipe.runtime.runner import GripperAnchor

    policy, spec = runner.policy, runner.spec
    window = WindowConfig(spec.n_obs_steps, spec.horizon, spec.n_action_steps)
    data = WindowDataset(store, episodes, window, episode_start=policy.config.remember_release)
    root = zarr.open_group(store, mode="r")
    times = root[layout.TIMESTAMP][:]
    recorded = {
        i: (root[layout.eef_pos(i)][:], root[layout.eef_rot(i)][:], root[layout.gripper_width(i)][:])
        for i in spec.grippers
    }
    generator = torch.Generator().manual_seed(seed)
    out = []
    for e in episodes:
        picks = np.flatnonzero(data.anchor_episodes == e)[:: window.n_action_steps]
        if not len(picks):
            continue
        conditions, relatives = [], []
        with torch.no_grad():
            for start in range(0, len(picks), BATCH):
                batch = observations(data, picks[start : start + BATCH])
                condition = policy.condition(batch)
                conditions.append(condition.numpy())
                relatives.append(
                    policy.predict_action(batch, generator, condition=condition).double().numpy()
                )
        relative = np.concatenate(relatives)
        chunks = []
        for j, row in enumerate(data.anchors[picks]):
            anchors = {
                i: GripperAnchor(
                    pos[row], Rotation.from_rotvec(rot[row]).as_matrix(), float(np.ravel(width[row])[0])
                )
                for i, (pos, rot, width) in recorded.items()
            }
            chunks.append(runner.compose(relative[j], int(round(times[row] * NS)), anchors, None))
        out.append(EpisodeChunks(e, np.concatenate(conditions).astype(np.float32), chunks))
    return out
