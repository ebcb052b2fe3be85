"""The monitor's scores and its conformal thresholds, on generated data with known answers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from policypipe.monitor.calibration import MonitorConfig, TooFewCalibrationValues, conformal_quantile
from policypipe.monitor.reading import MonitorReading
from policypipe.monitor.scores import Calibration, EmbeddingBank, Monitor, chunk_inconsistency, combined_score
from policypipe.rollout.report import wilson_interval
from policypipe.runtime.chunk import ActionChunk, GripperTargets
from policypipe.runtime.runner import GripperAnchor

PERIOD_NS = 100_000_000  # 10 Hz


def test_novelty_is_the_mean_distance_to_the_nearest_training_embeddings_per_dimension() -> None:
    rng = np.random.default_rng(0)
    training = rng.normal(size=(500, 12)) * np.linspace(0.1, 5.0, 12)  # dimensions of unequal spread
    bank = EmbeddingBank.of(training, neighbours=3)
    queries = rng.normal(size=(7, 12)) * 3
    z_train = (training - training.mean(0)) / training.std(0)
    z_query = (queries - training.mean(0)) / training.std(0)
    distances = np.linalg.norm(z_query[:, None] - z_train[None], axis=-1)
    expected = np.sort(distances, axis=1)[:, :3].mean(axis=1) / math.sqrt(12)
    np.testing.assert_allclose(bank.novelty(queries), expected, rtol=1e-4)
    # A training sample is its own nearest neighbour; a far point is far.
    assert EmbeddingBank.of(training, 1).novelty(training[:5]) == pytest.approx(np.zeros(5), abs=1e-3)
    assert bank.novelty(training.mean(0, keepdims=True) + 100 * training.std(0))[0] > 50


def test_a_bank_needs_more_samples_than_neighbours() -> None:
    with pytest.raises(ValueError, match="more training samples than neighbours"):
        EmbeddingBank.of(np.zeros((5, 3)), neighbours=5)


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.2])
def test_the_conformal_threshold_holds_its_false_alarm_rate_on_new_nominal_values(alpha: float) -> None:
    """Split conformal: a new exchangeable value exceeds the ceil((n+1)(1-alpha))-th of n with
    probability in [alpha - 1/(n+1), alpha]. Over many calibrations, the realised rate is there."""
    rng = np.random.default_rng(1)
    n, trials, held_out = 400, 300, 2000
    exceeded = 0
    for _ in range(trials):
        threshold = conformal_quantile(rng.gamma(2.0, size=n), alpha, "a score")
        exceeded += int((rng.gamma(2.0, size=held_out) > threshold).sum())
    low, high = wilson_interval(exceeded, trials * held_out)
    assert low <= alpha and high >= alpha - 1 / (n + 1)


def test_too_few_calibration_values_for_the_rate_are_refused_saying_how_many() -> None:
    with pytest.raises(TooFewCalibrationValues, match="at least 99"):
        conformal_quantile(np.arange(50.0), 0.01, "novelty")
    with pytest.raises(ValueError, match="false_alarm_rate must be in"):
        MonitorConfig(false_alarm_rate=0.0)


def _chunk(t0_ns: int, positions: np.ndarray, anchor: GripperAnchor, widths: np.ndarray) -> ActionChunk:
    """A one-gripper chunk at t0 of world positions (H, 3) and widths (H,), turned as the anchor is
    throughout, with its relative actions from `anchor`."""
    h = len(positions)
    relative = np.zeros((h, 10))
    relative[:, :3] = (positions - anchor.position) @ anchor.rotation  # R^T (p - p_t), row vectors
    relative[:, 3:9] = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # no turn from the anchor's
    relative[:, 9] = widths - anchor.width
    quaternion = np.tile(Rotation.from_matrix(anchor.rotation).as_quat(), (h, 1))
    return ActionChunk(
        observation_ns=t0_ns,
        time_ns=t0_ns + PERIOD_NS * (np.arange(h) + 1),
        grippers={0: GripperTargets(positions, quaternion, widths)},
        execute=np.arange(h) < h // 2,
        past=np.zeros(h, bool),
        relative=relative,
    )


def _line(t_ns: np.ndarray) -> np.ndarray:
    """A straight motion at 0.1 m/s along x."""
    return np.stack([0.1 * t_ns / 1e9, np.zeros_like(t_ns, float), np.full(len(t_ns), 0.2)], axis=1)


def _identity(x):  # the raw relative actions, so that the expected values are exact
    return x


H, SHIFT = 8, 4  # a chunk of 8 steps, the next one asked for 4 steps later: 4 steps shared
TURNED = Rotation.from_euler("z", 30, degrees=True).as_matrix()


def _first() -> ActionChunk:
    anchor = GripperAnchor(_line(np.array([0]))[0], TURNED, 0.05)
    return _chunk(0, _line(PERIOD_NS * (np.arange(H) + 1)), anchor, np.full(H, 0.05))


def _next(offset=(0.0, 0.0, 0.0), bend=(0.0, 0.0, 0.0), width: float = 0.05) -> ActionChunk:
    """The chunk asked for SHIFT steps later, from a gripper `offset` off the first chunk's path,
    moving on along the line `bend` off it, at `width`."""
    t1 = SHIFT * PERIOD_NS
    anchor = GripperAnchor(_line(np.array([t1]))[0] + offset, TURNED, 0.05)
    path = _line(t1 + PERIOD_NS * (np.arange(H) + 1)) + np.asarray(offset) + np.asarray(bend)
    return _chunk(t1, path, anchor, np.full(H, width))


def test_inconsistency_is_zero_for_the_same_motion_wherever_the_gripper_went_and_measures_a_departure() -> (
    None
):
    first = _first()
    assert chunk_inconsistency(first, _next(), _identity) == pytest.approx(0, abs=1e-9)
    # The gripper 1 cm off where the first chunk expected it (a demonstrator's path in open loop,
    # or poor tracking), the same motion from there: consistent.
    assert chunk_inconsistency(first, _next(offset=(0.0, 0.01, 0.0)), _identity) == pytest.approx(0, abs=1e-9)
    # The new chunk 1 cm higher and 2 mm more open at every step: over the 4 shared steps' 10
    # numbers each, the RMS is sqrt((0.01^2 + 0.002^2) / 10).
    departed = _next(bend=(0.0, 0.0, 0.01), width=0.052)
    expected = math.sqrt((0.01**2 + 0.002**2) / 10)
    assert chunk_inconsistency(first, departed, _identity) == pytest.approx(expected)
    # No previous chunk, or one whose span the new observation lies outside: undefined.
    assert math.isnan(chunk_inconsistency(None, departed, _identity))
    late = dataclasses.replace(
        departed, observation_ns=100 * PERIOD_NS, time_ns=departed.time_ns + 100 * PERIOD_NS
    )
    assert math.isnan(chunk_inconsistency(first, late, _identity))


def test_the_normalised_inconsistency_uses_the_policys_own_action_scale() -> None:
    """With a policy's normaliser, a departure in a dimension the training actions barely use counts
    more than the same departure in one they span widely."""
    scale = torch.ones(10)
    scale[1] = 100.0  # y barely varies in training: its normalised units are small metres

    def normalize(x):
        return x * scale

    # In the anchor's frame: the chunks' motion is along world x, turned 30 degrees in the tool frame.
    along_y = chunk_inconsistency(_first(), _next(bend=TURNED @ [0.0, 0.01, 0.0]), normalize)
    along_z = chunk_inconsistency(_first(), _next(bend=TURNED @ [0.0, 0.0, 0.01]), normalize)
    assert along_y == pytest.approx(100 * along_z)


def _calibration(persist: int) -> Calibration:
    bank = EmbeddingBank.of(np.random.default_rng(2).normal(size=(100, 4)), neighbours=1)
    return Calibration(bank, 1.0, 1.0, 2.0, persist, 0.01)


def test_the_alarm_needs_persist_chunks_in_a_row_above_the_threshold_and_a_new_episode_starts_over() -> None:
    monitor = Monitor(_calibration(persist=2), _identity)
    anchor = GripperAnchor(np.zeros(3), np.eye(3), 0.05)
    near, far = np.zeros((1, 4)), np.full((1, 4), 30.0)

    def read(embedding, step: int, start: int = 0) -> MonitorReading:
        t = (start + step * 4) * PERIOD_NS
        chunk = _chunk(t, _line(t + PERIOD_NS * (np.arange(8) + 1)), anchor, np.full(8, 0.05))
        return monitor.read(embedding, chunk, episode_start_ns=start)

    first = read(far, 0)
    assert math.isnan(first.inconsistency) and first.score > 1 and not first.alarm  # one chunk is no alarm
    assert read(far, 1).alarm  # two in a row
    assert not read(near, 2).alarm  # the minimum over the last two falls below
    assert not read(far, 3).alarm and read(far, 4).alarm
    # Another episode: its first far chunk alone raises nothing.
    assert not read(far, 0, start=10_000).alarm


def test_a_reading_goes_over_the_wire_and_back_with_nan_as_null() -> None:
    reading = MonitorReading(0.5, math.nan, 1.5, True)
    assert reading.fields() == {"novelty": 0.5, "inconsistency": None, "score": 1.5, "alarm": True}
    back = MonitorReading.from_fields(reading.fields())
    assert back.novelty == 0.5 and math.isnan(back.inconsistency) and back.alarm
    with pytest.raises(ValueError, match="novelty, inconsistency, score and alarm"):
        MonitorReading.from_fields({"novelty": 1.0})


def test_the_alarm_combines_only_the_scores_it_names() -> None:
    both = _calibration(persist=1)
    novelty_only = dataclasses.replace(both, alarm_scores=("novelty",))
    assert combined_score(0.5, 3.0, both) == 3.0 and combined_score(0.5, 3.0, novelty_only) == 0.5
    assert combined_score(0.5, math.nan, both) == 0.5  # an undefined inconsistency counts 0
    with pytest.raises(ValueError, match="novelty, inconsistency or both"):
        MonitorConfig(alarm_scores=())
