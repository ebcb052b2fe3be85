"""Grasps and releases read off a recording's own width stream, and the labels they give each frame."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation, Slerp

from policypipe.dataset import events, layout
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.windows import WindowConfig
from policypipe.recordings.streams import Topics, read_streams
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.synthetic.ground_truth import RecordingDraws
from policypipe.synthetic.simulator import NS
from tests.dataset.conftest import make_store
from tests.synthetic.test_takeover import first_strayed_state, take_over


def pick_and_place_width(t: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """Open at 80 mm, closes over 1.0-1.5 s onto a 24 mm block (reading 20 mm: the pads give), holds,
    opens over 5.0-5.4 s; with `rng`, a reading's noise of 0.3 mm."""
    closing = np.clip((t - 1.0) / 0.5, 0, 1)
    opening = np.clip((t - 5.0) / 0.4, 0, 1)
    width = 0.080 - 0.060 * closing + 0.060 * opening
    return width if rng is None else width + rng.normal(0, 0.0003, len(t))


def test_a_close_and_an_open_through_a_noisy_reading_are_one_grasp_and_one_release() -> None:
    t = np.arange(0, 7, 1 / 45)
    found = events.find_events(t, pick_and_place_width(t, np.random.default_rng(0)))
    assert len(found.grasp_s) == 1 and len(found.release_s) == 1
    # Arrived within 2 mm of the closed opening: 1.5 s less the last 2 mm of 60 mm's travel.
    assert found.grasp_s[0] == pytest.approx(1.5 - 0.5 * 2 / 60, abs=0.03)
    assert found.release_s[0] == pytest.approx(5.0 + 0.4 * 2 / 60, abs=0.03)


def test_a_tremor_and_a_squeeze_below_the_swing_are_not_events() -> None:
    t = np.arange(0, 5, 1 / 45)
    width = 0.05 + 0.004 * np.sin(7 * t)  # 8 mm peak to peak: less than a close
    assert events.find_events(t, width) == events.Events((), ())


def test_an_episode_without_a_close_or_without_an_open_is_named_with_why() -> None:
    t = np.arange(0, 5, 1 / 45)
    never_closes = events.find_events(t, np.full(len(t), 0.08))
    closes_only = events.find_events(t, 0.08 - 0.06 * np.clip(t - 1, 0, 1))
    assert "never closes by 10 mm" in events.missing_events(never_closes)
    assert closes_only.grasp_s and "never opens" in events.missing_events(closes_only)
    # A gripper that opens, closes and stays closed: the opening before the close is not a release.
    opens_then_closes = events.find_events(
        t, 0.05 + 0.03 * np.clip(t - 1, 0, 1) - 0.06 * np.clip(t - 3, 0, 1)
    )
    assert opens_then_closes.grasp_s and not opens_then_closes.release_s
    assert "never opens" in events.missing_events(opens_then_closes)


def takeover_events(wanted, what: str):
    """The demonstrator's takeover from the first strayed state that is `wanted`, and the events of its
    width sampled at 45 Hz from its start, as a recording of it has them."""
    plan, sim, seed = first_strayed_state(wanted, what)
    takeover = take_over(plan, sim, seed)
    t_ns = np.arange(takeover.start_ns, takeover.end_ns, NS // 45)
    return takeover, events.find_events((t_ns - t_ns[0]) / 1e9, takeover.width_at(t_ns))


def test_a_recording_that_begins_holding_has_its_release_and_no_grasp() -> None:
    """A correction taken over mid-carry (`policypipe corrections`): the demonstrator's takeover from
    a state where the simulator's fingers hold the block, its width as the recording has it. It
    releases where the plan opens the fingers, and the event loss takes it (its frames' next-release
    labels; none for the next grasp)."""
    takeover, found = takeover_events(lambda s: s.held, "held the block")
    assert found.grasp_s == ()
    (release,) = found.release_s
    # The plan's fingers start to open at release_s; the rule's release is 2 mm into that smooth
    # opening, 0.05-0.08 s later on the sample's plans (docs/dataset.md).
    assert 0.0 < release - takeover.release_s < 0.1
    assert events.missing_events(found) is None


def test_a_takeover_from_fingers_closed_on_nothing_grasps_then_releases() -> None:
    """The takeover opens the closed fingers first: that opening is no release, the grasp and the
    release after it are the recording's."""
    takeover, found = takeover_events(
        lambda s: not s.held and s.width < 0.02, "closed the fingers on nothing"
    )
    (grasp,) = found.grasp_s
    (release,) = found.release_s
    assert grasp < release and 0.0 < release - takeover.release_s < 0.1


def test_a_sample_recordings_own_width_stream_gives_its_demonstrators_grasp_and_release(
    tmp_path: Path,
) -> None:
    config = SampleConfig(recordings=2, seed=3, defects=False, image_width=64, image_height=48)
    export = write_sample_export(tmp_path / "raw", config, workers=1)
    for index, vio in enumerate(sorted(export.root.rglob("*_vio.mcap"))):
        streams = read_streams(vio, Topics())
        plan = RecordingDraws.of(config.seed, index).single_plan(0.0)
        t0 = streams.width_ns[0]
        found = events.find_events((streams.width_ns - t0) / 1e9, streams.width)
        truth = {k: (v - t0) / 1e9 for k, v in plan.events_ns.items()}
        # The plan's grasp is where the fingers stop, its release where they start to open; the
        # reading comes within 2 mm of those a width sample or two (~45 Hz) and the last 2 mm earlier.
        assert len(found.grasp_s) == len(found.release_s) == 1
        assert found.grasp_s[0] == pytest.approx(truth["grasp"], abs=0.15)
        assert found.release_s[0] == pytest.approx(truth["release"], abs=0.15)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The tiny store's widths swing by 60 mm every ~1.6 s: each episode has grasps and releases."""
    make_store(tmp_path / "ds.zarr", lengths=(90, 75, 120))
    return tmp_path / "ds.zarr"


def slerp_pose(root: zarr.Group, episode: int, t: float) -> tuple[np.ndarray, np.ndarray]:
    """Gripper 0's pose at time t of `episode`, from its recorded samples, written independently."""
    ends = np.concatenate([[0], root[layout.POSE_EPISODE_ENDS][:]])
    span = slice(ends[episode], ends[episode + 1])
    times, pos, rot = (root[k][span] for k in (layout.POSE_TIMESTAMP, layout.POSE_POS, layout.POSE_ROT))
    p = np.array([np.interp(t, times, pos[:, k]) for k in range(3)])
    return p, Slerp(times, Rotation.from_rotvec(rot))([t]).as_matrix()[0]


def test_each_frames_labels_are_the_pose_at_its_next_grasp_and_release_in_its_gripper_frame(
    store: Path,
) -> None:
    root = zarr.open_group(store, mode="r")
    found = events.dataset_events(root)
    labels = events.event_labels(root, found)
    ends = np.concatenate([[0], root[layout.EPISODE_ENDS][:]])
    frame_t, frame_pos = root[layout.TIMESTAMP][:], root[layout.EEF_POS][:].astype(np.float64)
    frame_rot = Rotation.from_rotvec(root[layout.EEF_ROT][:].astype(np.float64)).as_matrix()
    checked = {"grasp": 0, "release": 0, "none": 0}
    for e, record in enumerate(found["episodes"]):
        ev = record["grippers"][0]
        for row in range(ends[e], ends[e + 1], 7):
            for column, (kind, key) in enumerate(
                (("grasp", events.NEXT_GRASP), ("release", events.NEXT_RELEASE))
            ):
                later = [t for t in ev[f"{kind}_s"] if t > frame_t[row]]
                assert labels[events.VALID][row, column] == bool(later)
                if not later:
                    checked["none"] += 1
                    assert not labels[key][row].any()
                    continue
                p, r = slerp_pose(root, e, later[0])
                r_rel = frame_rot[row].T @ r
                expected = np.concatenate([frame_rot[row].T @ (p - frame_pos[row]), r_rel[:, 0], r_rel[:, 1]])
                np.testing.assert_allclose(labels[key][row], expected, atol=2e-5)
                checked[kind] += 1
    assert min(checked.values()) > 3  # every case was met


def test_stats_hold_the_events_and_their_labels_statistics_and_training_refuses_an_episode_without(
    store: Path,
) -> None:
    root = zarr.open_group(store, mode="r")
    stats = json.loads(json.dumps(compute_statistics(root, WindowConfig(1, 4, 2), StatsConfig(seed=1))))
    assert [r["stem"] for r in stats["events"]["episodes"]] == ["ep0", "ep1", "ep2"]
    assert set(stats["events"]["labels"]) == {"event.next_grasp", "event.next_release"}
    assert len(stats["events"]["labels"]["event.next_grasp"]["mean"]) == 9
    labels = events.training_labels(store, stats, [0, 1, 2])
    assert labels[events.NEXT_GRASP].shape == (285, 9) and labels[events.VALID].shape == (285, 2)

    stats["events"]["episodes"][1]["missing"] = "its gripper width never closes by 10 mm or more: no grasp"
    with pytest.raises(ValueError, match=r"1 of the training and validation recordings have none: ep1 \(its"):
        events.training_labels(store, stats, [0, 1, 2])
    events.training_labels(store, stats, [0, 2])  # the others alone are accepted
