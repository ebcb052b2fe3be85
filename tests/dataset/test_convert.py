"""convert on real MCAP files written by the sample simulator, against its ground truth."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial.transform import Rotation

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.convert import ConversionResult, convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import DAMAGE_WARNING
from policypipe.dataset.errors import DatasetError
from policypipe.lineage.hashing import sha256_path
from policypipe.recordings.messages import Topics
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.recording import StreamTiming, write_raw_mcap, write_vio_mcap
from policypipe.synthetic.render import read_timecode, timecode_value
from tests.conftest import mcap_samples, write_status
from tests.leftovers import describe, group_members, wait_until_gone

START_NS = 1_762_160_000_000_000_000
CONFIG = ConvertConfig(image_size=(64, 48), min_frames=10, workers=1)


def add_recording(export: Path, stem: str, seed: int, *, timing: StreamTiming | None = None, **vio_options):
    """Writes a triplet; returns (plan, truth) of the processed recording."""
    rng = np.random.default_rng(seed)
    plan = plan_motion(rng, START_NS + seed * 60_000_000_000, duration_s=3.0)
    timing = timing or StreamTiming(
        camera_start_s=0.05, pose_start_s=0.1, width_start_s=0.02, width_stop_s=0.2
    )
    options = {"image_size": (96, 72), "timecode": True} | vio_options
    truth = write_vio_mcap(export / f"{stem}_vio.mcap", plan, timing, rng, **options)
    write_raw_mcap(export / f"{stem}.mcap", plan, timing, np.random.default_rng(seed), image_size=(32, 24))
    write_status(export / f"{stem}_vio.json", stem, frames=truth.frames)
    return plan, truth


def convert(export: Path, out: Path, config: ConvertConfig = CONFIG, cache: Path | None = None):
    manifest = out.parent / f"{out.name}.manifest.json"
    write_json_atomic(manifest, pair_export(export, PairConfig(accept_truncated=True)).manifest())
    return convert_dataset(manifest, export, out, cache or out.parent / f"{out.name}.cache", config)


def episodes(store: Path):
    root = zarr.open_group(store, mode="r")
    ends = root[layout.EPISODE_ENDS][:]
    starts = np.concatenate([[0], ends[:-1]])
    return root, list(zip(starts, ends))


def check_against_truth(root, start, end, record, plan, truth) -> None:
    t_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start:end] * 1e9).astype(np.int64)
    pos, quat = plan.pose_at(t_ns)
    assert np.abs(root[layout.EEF_POS][start:end] - pos).max() < 1e-4
    rot = Rotation.from_rotvec(root[layout.EEF_ROT][start:end])
    assert np.degrees((rot.inv() * Rotation.from_quat(quat)).magnitude()).max() < 0.05
    # Width is sampled at ~45 Hz while the fingers close within a fraction of a second: the
    # interpolation is exact with respect to the recorded samples, and near the continuous truth.
    width = root[layout.GRIPPER_WIDTH][start:end, 0]
    recorded = np.interp(
        (t_ns - START_NS).astype(float),
        (truth.width_ns - START_NS).astype(float),
        plan.width_at(truth.width_ns),
    )
    assert np.abs(width - recorded).max() < 1e-4
    assert np.abs(width - plan.width_at(t_ns)).max() < 3e-3
    # The right frame at the right index: each stored frame shows its own capture time.
    frames = root[layout.RGB][start:end]
    shown = [read_timecode(f) for f in frames]
    assert shown == [timecode_value(t) for t in t_ns]
    # The recorded samples covering the frames, on the same clock as the frames.
    e = [r["stem"] for r in root.attrs[layout.ATTRS_EPISODES]].index(record["stem"])
    for times_key, ends_key, recorded in (
        (layout.POSE_TIMESTAMP, layout.POSE_EPISODE_ENDS, truth.pose_ns),
        (layout.WIDTH_TIMESTAMP, layout.WIDTH_EPISODE_ENDS, truth.width_ns),
    ):
        ends = root[ends_key][:]
        sample_ns = record["start_ns"] + np.round(
            root[times_key][(ends[e - 1] if e else 0) : ends[e]] * 1e9
        ).astype(np.int64)
        assert sample_ns[0] <= t_ns[0] < sample_ns[1] and sample_ns[-2] < t_ns[-1] <= sample_ns[-1]
        assert set(sample_ns.tolist()) <= set(recorded.tolist())


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"camera": "video"},
        {"image_format": "png"},
        {"chunked": False, "summary": False},
        {"compression": "lz4"},
        {"compression": "none", "summary": False},
    ],
    ids=["jpeg-zstd", "h264", "png", "unchunked-no-summary", "lz4", "uncompressed-no-summary"],
)
def test_poses_widths_and_frames_match_the_truth_at_every_kept_frame(tmp_path: Path, variant: dict) -> None:
    export = tmp_path / "export"
    export.mkdir()
    plan, truth = add_recording(export, "rec", 1, **variant)
    camera = "/camera0/video" if variant.get("camera") == "video" else "/camera0/image"

    result = convert(export, tmp_path / "ds.zarr", replace(CONFIG, topics=Topics(camera=camera)))

    root, spans = episodes(tmp_path / "ds.zarr")
    (record,) = root.attrs[layout.ATTRS_EPISODES]
    check_against_truth(root, *spans[0], record, plan, truth)
    assert record["frequency_hz"] == pytest.approx(30.0, rel=0.005)
    assert record["frames_in"] == truth.frames  # every written frame was read
    # Frames before the pose and width streams began are trimmed, not extrapolated.
    assert record["start_ns"] >= max(truth.pose_ns[0], truth.width_ns[0])
    assert result.metrics()["episodes"] == 1 and root.attrs[layout.ATTRS_IMAGE_SIZE] == [64, 48]


def test_pose_slower_than_the_camera_and_out_of_order_log_times(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    timing = StreamTiming(pose_hz=20.0, out_of_order_fraction=0.05, camera_drop_fraction=0.1)
    plan, truth = add_recording(export, "slow", 2, timing=timing)

    convert(export, tmp_path / "ds.zarr")

    root, spans = episodes(tmp_path / "ds.zarr")
    (record,) = root.attrs[layout.ATTRS_EPISODES]
    start, end = spans[0]
    t_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start:end] * 1e9).astype(np.int64)
    # Exact with respect to the recorded 20 Hz samples; between them, close to the hand's motion.
    pos = root[layout.EEF_POS][start:end]
    rel = lambda ns: (ns - START_NS).astype(float)  # noqa: E731
    recorded = plan.pose_at(truth.pose_ns)[0]
    expected = np.stack([np.interp(rel(t_ns), rel(truth.pose_ns), recorded[:, k]) for k in range(3)], axis=1)
    assert np.abs(pos - expected).max() < 1e-4
    assert np.abs(pos - plan.pose_at(t_ns)[0]).max() < 5e-3
    assert np.all(np.diff(t_ns) > 0)
    assert [read_timecode(f) for f in root[layout.RGB][start:end]] == [timecode_value(t) for t in t_ns]
    # Dropped frames are gaps in the clock, counted, not a different rate.
    assert record["frequency_hz"] == pytest.approx(30.0, rel=0.005)
    in_span = (truth.camera_ns >= t_ns[0]) & (truth.camera_ns <= t_ns[-1])
    nominal = 1e9 / 30.0
    expected_gaps = int(np.rint(np.diff(truth.camera_ns[in_span]) / nominal).sum() - (in_span.sum() - 1))
    assert record["camera_gaps"] == expected_gaps > 0


def test_bad_recordings_are_excluded_with_reasons_and_the_rest_is_intact(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    plan_a, truth_a = add_recording(export, "a_good", 3)
    plan_b, truth_b = add_recording(export, "b_good", 4)
    # Real public MCAP files as _vio.mcap: well-formed, but not a gripper recording.
    for i, name in enumerate(["rerun_simple-protobuf.mcap", "depthai_recording.mcap", "TenMessages.mcap"]):
        sample = next(mcap_samples().rglob(name))
        add_recording(export, f"c_real_{i}", 10 + i)
        shutil.copyfile(sample, export / f"c_real_{i}_vio.mcap")
        write_status(export / f"c_real_{i}_vio.json", f"c_real_{i}")
    # Truncated mid-file (a writer without chunks, as a crashing logger leaves it): what is
    # readable before the damage becomes the episode.
    plan_e, truth_e = add_recording(export, "e_truncated", 6, chunked=False, summary=False)
    data = (export / "e_truncated_vio.mcap").read_bytes()
    (export / "e_truncated_vio.mcap").write_bytes(data[: int(len(data) * 0.6)])

    config = replace(CONFIG, topics=Topics(camera="/camera0/image"))
    result = convert(export, tmp_path / "ds.zarr", config)

    excluded = {e["stem"]: (e["excluded"], e["detail"]) for e in result.excluded}
    assert set(excluded) == {"c_real_0", "c_real_1", "c_real_2"}
    assert all(reason == "missing_topic" for reason, _ in excluded.values())
    assert "topics present: mouse (MouseEvent), pose (foxglove.PoseInFrame)" in excluded["c_real_0"][1]
    root, spans = episodes(tmp_path / "ds.zarr")
    records = root.attrs[layout.ATTRS_EPISODES]
    assert [r["stem"] for r in records] == ["a_good", "b_good", "e_truncated"]
    check_against_truth(root, *spans[0], records[0], plan_a, truth_a)
    check_against_truth(root, *spans[1], records[1], plan_b, truth_b)
    check_against_truth(root, *spans[2], records[2], plan_e, truth_e)
    assert 0 < records[2]["frames"] < truth_e.frames * 0.7
    assert any("truncated" in w for w in records[2]["warnings"])
    assert any("status json says" in w for w in records[2]["warnings"])


def test_unexpected_schema_on_a_topic_names_it_and_what_was_expected(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a", 3)
    with pytest.raises(DatasetError, match="no recording could be converted") as info:
        convert(export, tmp_path / "ds.zarr", replace(CONFIG, topics=Topics(camera="/vio/pose")))
    assert "/vio/pose has schema 'foxglove.PoseInFrame', expected foxglove.CompressedImage" in str(info.value)
    assert not (tmp_path / "ds.zarr").exists()


def test_a_recording_at_another_rate_fails_before_writing_unless_resampled(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    recordings = [add_recording(export, "a", 3), add_recording(export, "b", 4)]
    recordings.append(
        add_recording(export, "c_15hz", 5, timing=StreamTiming(camera_hz=15.0, camera_drop_fraction=0.2))
    )

    with pytest.raises(DatasetError, match=r"c_15hz \(15\.\d+ Hz\).*convert.resample_hz"):
        convert(export, tmp_path / "ds.zarr")
    assert not (tmp_path / "ds.zarr").exists()

    result = convert(export, tmp_path / "ds.zarr", replace(CONFIG, resample_hz=10.0))
    root, spans = episodes(tmp_path / "ds.zarr")
    assert root.attrs[layout.ATTRS_FREQUENCY] == 10.0
    for record, (start, end), (plan, truth) in zip(root.attrs[layout.ATTRS_EPISODES], spans, recordings):
        # Each image with the pose and width of its own capture time, which is its timestamp.
        check_against_truth(root, start, end, record, plan, truth)
        # The frames nearest a 10 Hz grid from the first kept frame, each once; how far from the
        # grid they are is reported (a 15 Hz camera with drops: up to ~1.5 of its frame periods).
        t_ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start:end] * 1e9).astype(np.int64)
        recorded = truth.camera_ns[(truth.camera_ns >= t_ns[0]) & (truth.camera_ns <= t_ns[-1])]
        grid = np.arange(t_ns[0], t_ns[-1] + 1, 100_000_000)
        nearest = recorded[np.abs(recorded[:, None] - grid[None]).argmin(axis=0)]
        assert t_ns.tolist() == np.unique(nearest).tolist()
        assert np.abs(nearest - grid).max() / 1e6 <= record["resample_offset_ms"]["max"] + 1e-3 < 100
        # The record describes the camera, measured on its own frames, not the frames kept on the grid.
        assert record["frequency_hz"] == pytest.approx(15.0 if record["stem"] == "c_15hz" else 30.0, rel=0.01)
    assert (
        result.metrics()["resample_offset_ms_max"]
        == max(r["resample_offset_ms"]["max"] for r in root.attrs[layout.ATTRS_EPISODES])
        > 10
    )


def test_output_is_byte_identical_with_one_or_two_workers_and_opens_with_plain_zarr(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for i in range(3):
        add_recording(export, f"r{i}", 20 + i)

    convert(export, tmp_path / "one.zarr", replace(CONFIG, workers=1))
    convert(export, tmp_path / "two.zarr", replace(CONFIG, workers=2))

    assert sha256_path(tmp_path / "one.zarr") == sha256_path(tmp_path / "two.zarr")
    probe = (
        "import sys, zarr; z = zarr.open(sys.argv[1], mode='r'); "
        "print(z['data/camera0_rgb'][5].shape, z['meta/episode_ends'][:].tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "one.zarr")], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("(48, 64, 3)")


def test_store_file_count_grows_per_hundred_frames_not_per_frame(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "r", 7)
    result = convert(export, tmp_path / "ds.zarr")
    image_files = list((tmp_path / "ds.zarr" / "data" / "camera0_rgb").rglob("c/*/*/*/*"))
    assert len(image_files) == -(-result.frames // layout.FRAMES_PER_SHARD)


def test_adding_a_recording_converts_only_the_new_one(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    cache = tmp_path / "cache"
    add_recording(export, "a", 3)
    add_recording(export, "b", 4)
    (cache / "v0").mkdir(parents=True)  # an older converter's entries: never hit again, removed
    convert(export, tmp_path / "first.zarr", cache=cache)
    entries = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}

    add_recording(export, "c", 5)
    convert(export, tmp_path / "second.zarr", cache=cache)

    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert not (cache / "v0").exists()
    assert {p: after[p] for p in entries} == entries  # untouched
    assert len(set(after) - set(entries)) == 2  # the new recording's arrays and record
    root, _ = episodes(tmp_path / "second.zarr")
    assert [r["stem"] for r in root.attrs[layout.ATTRS_EPISODES]] == ["a", "b", "c"]


# One conversion with CONFIG in a process of its own: args manifest, export, out, cache.
CONVERT_SCRIPT = """
import sys
from pathlib import Path
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
convert_dataset(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]),
                ConvertConfig(image_size=(64, 48), min_frames=10, workers=1))
"""


def test_sigkill_mid_conversion_then_rerun_gives_the_uninterrupted_store(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for i in range(4):
        add_recording(export, f"r{i}", 30 + i)
    reference = tmp_path / "reference.zarr"
    convert(export, reference)
    manifest = tmp_path / "reference.zarr.manifest.json"

    out, cache = tmp_path / "ds.zarr", tmp_path / "killed_cache"
    # The conversion alone is killed, as the out-of-memory killer does: its pool's worker must die
    # with it (it converted on for 20 minutes and more before workers had the parent-death
    # signal). A process group of its own, so the test can tell what is left and clean it up.
    proc = subprocess.Popen(
        [sys.executable, "-c", CONVERT_SCRIPT, str(manifest), str(export), str(out), str(cache)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(cache.glob("*/*.json")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(group_members(proc.pid)) >= 2, "no worker was converting when the run was killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = wait_until_gone(lambda: group_members(proc.pid), 10)
        assert not left, f"processes of the killed conversion still running:\n{describe(left)}"
    finally:
        if group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not out.exists()  # nothing that looks complete

    convert_dataset(manifest, export, out, cache, CONFIG)
    assert sha256_path(out) == sha256_path(reference)
    assert not list(tmp_path.glob(".ds.zarr.*"))  # no temporary left behind


def test_every_real_public_mcap_gives_a_clear_per_recording_error(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a_good", 3)
    samples = sorted(mcap_samples().rglob("*.mcap"))
    assert len(samples) >= 15, f"expected the 15 shared MCAP samples or more, found {len(samples)}"
    for i, sample in enumerate(samples):
        stem = f"real_{i:02d}"
        shutil.copyfile(sample, export / f"{stem}_vio.mcap")
        shutil.copyfile(sample, export / f"{stem}.mcap")
        write_status(export / f"{stem}_vio.json", stem)

    result = convert(export, tmp_path / "ds.zarr")

    assert [e["stem"] for e in result.episodes] == ["a_good"]
    excluded = {e["stem"]: e for e in result.excluded}
    assert len(excluded) == len(samples)
    for record in excluded.values():
        assert record["excluded"] == "missing_topic"
        assert "no messages on /camera0/image" in record["detail"] and "topics present:" in record["detail"]


def test_a_recording_that_breaks_the_converter_is_excluded_and_the_others_kept(
    tmp_path: Path, monkeypatch
) -> None:
    # Stands for any bug or library failure on input nobody foresaw (not a RecordingError).
    import policypipe.dataset.convert_workers as workers_module

    def read_streams(path: Path, topics, *numbers):
        if path.name.startswith("b_"):
            raise KeyError("nobody expected this")
        return real_read_streams(path, topics, *numbers)

    real_read_streams = workers_module.read_streams
    monkeypatch.setattr(workers_module, "read_streams", read_streams)
    export = tmp_path / "export"
    export.mkdir()
    for i, stem in enumerate(["a_good", "b_breaks", "c_good"]):
        add_recording(export, stem, 40 + i)

    result = convert(export, tmp_path / "ds.zarr")

    assert [e["stem"] for e in result.episodes] == ["a_good", "c_good"]
    (bad,) = result.excluded
    assert bad["stem"] == "b_breaks" and bad["excluded"] == "converter_error"
    assert bad["detail"].startswith("KeyError: 'nobody expected this' (at test_convert.py:")
    # Not cached: once the converter is fixed, the recording is tried again.
    assert not list((tmp_path / "ds.zarr.cache").glob(f"*/{bad['key']}.json"))


EDIT_CONVERTER = """

_build_episode_as_committed = build_episode


def build_episode(streams, config):  # an edit to the converter: every position moves by 1 m
    episode = _build_episode_as_committed(streams, config)
    episode.grippers[0].eef_pos = episode.eef_pos + 1
    return episode
"""


def test_an_edited_converter_misses_the_cache_and_converts_anew(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a", 8)
    cache = tmp_path / "cache"
    convert(export, tmp_path / "committed.zarr", cache=cache)
    manifest = tmp_path / "committed.zarr.manifest.json"
    (old_folder,) = [p for p in cache.iterdir()]

    source = tmp_path / "src"
    shutil.copytree(
        Path(layout.__file__).parents[2] / "policypipe",
        source / "policypipe",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    with open(source / "policypipe/dataset/episode.py", "a") as f:
        f.write(EDIT_CONVERTER)
    edited = tmp_path / "edited.zarr"
    subprocess.run(
        [sys.executable, "-c", CONVERT_SCRIPT, str(manifest), str(export), str(edited), str(cache)],
        check=True,
        env=os.environ | {"PYTHONPATH": str(source)},
    )

    committed_root, edited_root = (
        zarr.open_group(tmp_path / "committed.zarr", mode="r"),
        zarr.open_group(edited, mode="r"),
    )
    np.testing.assert_allclose(
        edited_root[layout.EEF_POS][:], committed_root[layout.EEF_POS][:] + 1, atol=1e-5
    )
    assert not old_folder.exists()  # the committed converter's entries can never be hit again


def test_a_decisive_library_version_is_part_of_the_cache_key(monkeypatch) -> None:
    import policypipe.dataset.convert_cache as cache_module

    record = cache_module.RecordingInput("a", "", Path("a_vio.mcap"), "0" * 64, False, None)
    before = cache_module.cache_key(record, CONFIG)
    for name in cache_module.DECISIVE_DISTRIBUTIONS:
        real = cache_module._distribution_version
        monkeypatch.setattr(
            cache_module,
            "_distribution_version",
            lambda n, name=name, real=real: "0.0" if n == name else real(n),
        )
        cache_module.converter_identity.cache_clear()
        assert cache_module.cache_key(record, CONFIG) != before, name
        monkeypatch.undo()
    cache_module.converter_identity.cache_clear()
    assert cache_module.cache_key(record, CONFIG) == before


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real file system that fills up: a 256 KiB tmpfs (needs root, as in CI and here)."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


def test_a_full_disk_under_the_cache_says_where_and_how_much_and_leaves_no_temporary(
    tmp_path: Path, small_disk: Path
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for i in range(4):
        add_recording(export, f"r{i}", 50 + i, image_size=(320, 240), timecode=False)
    with pytest.raises(DatasetError) as failure:
        convert(
            export,
            tmp_path / "ds.zarr",
            config=replace(CONFIG, image_size=(320, 240)),
            cache=small_disk / "cache",
        )
    message = str(failure.value)
    assert message.startswith(f"no space left on the device writing {small_disk}/cache/")
    assert "MB more for the" in message and "MB free" in message and "--cache" in message
    assert _leftovers(small_disk) == [] and not (tmp_path / "ds.zarr").exists()


def test_a_full_disk_under_the_store_keeps_the_previous_dataset(tmp_path: Path, small_disk: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a", 60, image_size=(320, 240), timecode=False)
    out = small_disk / "ds.zarr"
    convert(export, out, config=replace(CONFIG, image_size=(32, 24)), cache=tmp_path / "cache")
    before = sha256_path(out)
    add_recording(export, "b", 61, image_size=(320, 240), timecode=False)
    with pytest.raises(DatasetError) as failure:
        convert(export, out, config=replace(CONFIG, image_size=(320, 240)), cache=tmp_path / "cache")
    assert str(failure.value).startswith(
        f"no space left on the device writing the dataset {out}: it needs about"
    )
    assert sha256_path(out) == before and _leftovers(small_disk) == []


# ---------------------------------------------------------------- one export, every kind of damage


def _write_recording(
    export: Path, stem: str, seed: int, *, camera: str = "image", image_size=(96, 72), edit=None
):
    """A triplet whose `_vio.mcap` messages pass through `edit` first; returns its messages as written."""
    from dataclasses import replace as replace_fields

    from policypipe.synthetic.recording import simulate_recording, write_simulated_raw, write_simulated_vio

    rng = np.random.default_rng(seed)
    plan = plan_motion(rng, START_NS + seed * 60_000_000_000, duration_s=2.0)
    timing = StreamTiming(camera_start_s=0.05, pose_start_s=0.1, width_start_s=0.02, width_stop_s=0.2)
    rec = simulate_recording(plan, timing, rng, camera=camera, image_size=image_size)
    messages = tuple(edit(list(rec.vio_messages)) if edit else rec.vio_messages)
    write_simulated_vio(export / f"{stem}_vio.mcap", replace_fields(rec, vio_messages=messages))
    write_simulated_raw(export / f"{stem}.mcap", rec)
    write_status(export / f"{stem}_vio.json", stem, frames=rec.truth.frames)
    return rec


def _camera_indices(messages) -> list[int]:
    return [i for i, m in enumerate(messages) if m.channel in ("image", "video")]


def _by_stem(store: Path) -> dict[str, dict[str, np.ndarray]]:
    root, spans = episodes(store)
    out = {}
    for record, (start, end) in zip(root.attrs[layout.ATTRS_EPISODES], spans):
        ns = record["start_ns"] + np.round(root[layout.TIMESTAMP][start:end] * 1e9).astype(np.int64)
        out[record["stem"]] = {"capture_ns": ns} | {
            key: root[key][start:end]
            for key in (layout.RGB, layout.EEF_POS, layout.EEF_ROT, layout.GRIPPER_WIDTH)
        }
    return out


def _flip_middle_chunk(path: Path) -> int:
    """Flips 64 bytes inside the middle chunk of a file whose footer and summary stay valid;
    returns the chunk's offset."""
    from mcap.reader import make_reader

    with open(path, "rb") as f:
        chunks = sorted(make_reader(f).get_summary().chunk_indexes, key=lambda c: c.chunk_start_offset)
    chunk = chunks[len(chunks) // 2]
    data = bytearray(path.read_bytes())
    middle = chunk.chunk_start_offset + chunk.chunk_length // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))
    return chunk.chunk_start_offset


@pytest.mark.slow
def test_an_export_mixing_good_and_damaged_recordings_keeps_every_good_one_byte_identical(
    tmp_path: Path,
) -> None:
    clean, mixed = tmp_path / "clean", tmp_path / "mixed"
    clean.mkdir(), mixed.mkdir()
    good = {"a_image": (1, "image"), "b_image": (2, "image"), "c_video": (3, "video")}
    for export in (clean, mixed):
        for stem, (seed, camera) in good.items():
            _write_recording(export, stem, seed, camera=camera)
    # The damaged ones, each also written undamaged to know what it should keep.
    reference = tmp_path / "undamaged"
    reference.mkdir()
    for export in (mixed, reference):
        # 640x480: a 256 KiB chunk then holds a few frames, and the file has many chunks.
        rec_d = _write_recording(export, "d_damaged_chunk", 4, image_size=(640, 480))
        _write_recording(export, "f_empty_message", 6)
    rec_e = _write_recording(reference, "e_lost_packet", 5, camera="video")
    cam = _camera_indices(rec_e.vio_messages)
    lost_packet = 10  # mid-GOP (an IDR every 30 packets): packets 11-29 reference it
    _write_recording(
        mixed,
        "e_lost_packet",
        5,
        camera="video",
        edit=lambda m: m[: cam[lost_packet]] + m[cam[lost_packet] + 1 :],
    )
    _write_recording(
        mixed,
        "f_empty_message",
        6,
        edit=lambda m: [replace(x, data=b"") if i == _camera_indices(m)[20] else x for i, x in enumerate(m)],
    )
    _flip_middle_chunk(mixed / "d_damaged_chunk_vio.mcap")
    rec_g = _write_recording(mixed, "g_4k", 7, image_size=(3840, 2160))

    result = convert(mixed, tmp_path / "mixed.zarr")
    convert(clean, tmp_path / "clean.zarr")
    convert(reference, tmp_path / "undamaged.zarr")

    assert [e["stem"] for e in result.excluded] == []
    got, want, undamaged = (
        _by_stem(tmp_path / "mixed.zarr"),
        _by_stem(tmp_path / "clean.zarr"),
        _by_stem(tmp_path / "undamaged.zarr"),
    )
    for stem in good:  # byte-identical to a run without the damaged recordings
        for key in want[stem]:
            np.testing.assert_array_equal(got[stem][key], want[stem][key], err_msg=f"{stem} {key}")
    report = {e["stem"]: e for e in result.episodes}
    for stem, ep in report.items():  # every frame read is kept or counted in `dropped`, by reason
        assert ep["frames"] == ep["frames_in"] - sum(ep["dropped"].values()), stem
    assert {report[s]["camera_topic"] for s in good} == {"/camera0/image", "/camera0/video"}

    # A damaged chunk: its messages are lost and counted, every other chunk is kept.
    d = report["d_damaged_chunk"]
    assert d["truncated"] is False and d["lost_messages"]["camera"] > 0
    assert d["frames_in"] + d["lost_messages"]["camera"] == rec_d.truth.frames
    assert any("CRC" in w or "chunk at byte" in w for w in d["warnings"])
    kept = set(got["d_damaged_chunk"]["capture_ns"].tolist())
    assert kept < set(undamaged["d_damaged_chunk"]["capture_ns"].tolist())
    assert len(undamaged["d_damaged_chunk"]["capture_ns"]) - len(kept) <= d["lost_messages"]["camera"] + 2

    # A lost H.264 packet: exactly the frames that reference it are dropped until the next keyframe.
    e = report["e_lost_packet"]
    lost_times = {int(t) for t in rec_e.truth.camera_ns[lost_packet:30]}
    expected = [t for t in undamaged["e_lost_packet"]["capture_ns"].tolist() if t not in lost_times]
    assert got["e_lost_packet"]["capture_ns"].tolist() == expected
    assert e["dropped"]["h264_reference_lost"] == 29 - lost_packet
    keep = np.isin(undamaged["e_lost_packet"]["capture_ns"], expected)
    np.testing.assert_array_equal(
        got["e_lost_packet"][layout.RGB], undamaged["e_lost_packet"][layout.RGB][keep]
    )

    # A zero-length message: one undecodable frame, nothing else changes.
    f = report["f_empty_message"]
    assert f["dropped"]["undecodable"] == 1, f
    assert set(got["f_empty_message"]["capture_ns"].tolist()) < set(
        undamaged["f_empty_message"]["capture_ns"].tolist()
    )
    assert len(undamaged["f_empty_message"]["capture_ns"]) - len(got["f_empty_message"]["capture_ns"]) <= 1

    # A 4K recording: resized like any other.
    assert (
        got["g_4k"][layout.RGB].shape[1:] == (48, 64, 3) and report["g_4k"]["frames_in"] == rec_g.truth.frames
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_a_recording_that_kills_its_worker_process_is_excluded_and_the_others_kept(
    tmp_path: Path, monkeypatch, workers: int
) -> None:
    # Stands for the kernel's out-of-memory killer or a crash inside a decoder: the worker dies.
    import policypipe.dataset.convert_workers as workers_module

    spans = tmp_path / "spans"  # each finished read's start and end on the system's monotonic clock

    def read_streams(path: Path, topics, *numbers):
        if path.name.startswith("b_"):
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        streams = real_read_streams(path, topics, *numbers)
        time.sleep(0.3)  # long enough that reads in several processes at once overlap
        with spans.open("a") as log:
            log.write(f"{path.name} {started} {time.monotonic()}\n")
        return streams

    real_read_streams = workers_module.read_streams
    monkeypatch.setattr(workers_module, "read_streams", read_streams)  # forked workers inherit it
    export = tmp_path / "export"
    export.mkdir()
    stems = ["a_good", "b_dies", "c_good", "d_good", "e_good", "f_good"]
    for i, stem in enumerate(stems):
        add_recording(export, stem, 70 + i)

    result = convert(export, tmp_path / "ds.zarr", config=replace(CONFIG, workers=workers))

    assert [e["stem"] for e in result.episodes] == [s for s in stems if s != "b_dies"]
    assert [(e["stem"], e["excluded"]) for e in result.excluded] == [("b_dies", "worker_died")]
    # After the death the recordings left go on `workers` at a time, each in a process of its own.
    after = [
        tuple(map(float, line.split()[1:])) for line in spans.read_text().splitlines() if line[0] in "def"
    ]
    most_at_once = max(sum(start <= t < end for start, end in after) for t, _ in after)
    assert most_at_once == workers


def test_a_renamed_recording_is_not_served_its_old_name_from_the_cache(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "old_name", 11)
    cache = tmp_path / "cache"
    convert(export, tmp_path / "first.zarr", cache=cache)
    for suffix in (".mcap", "_vio.mcap"):
        (export / f"old_name{suffix}").rename(export / f"new_name{suffix}")
    (export / "old_name_vio.json").unlink()
    write_status(export / "new_name_vio.json", "new_name", frames=5)  # and a status json that disagrees

    result = convert(export, tmp_path / "second.zarr", cache=cache)

    root, _ = episodes(tmp_path / "second.zarr")
    assert [r["stem"] for r in root.attrs[layout.ATTRS_EPISODES]] == ["new_name"]
    assert any("status json says 5 frames" in w for w in result.episodes[0]["warnings"])


def test_an_unreadable_cache_entry_is_converted_again(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a", 12)
    cache = tmp_path / "cache"
    convert(export, tmp_path / "first.zarr", cache=cache)
    (record,) = cache.glob("*/*.json")
    record.write_text("{ half a reco")

    convert(export, tmp_path / "second.zarr", cache=cache)

    assert sha256_path(tmp_path / "second.zarr") == sha256_path(tmp_path / "first.zarr")


def test_the_cache_folder_keeps_what_the_converter_did_not_put_there(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    add_recording(export, "a", 13)
    cache = tmp_path / "cache"
    (cache / "notes").mkdir(parents=True)
    (cache / "v1").mkdir()  # an older converter's entries: removed
    convert(export, tmp_path / "ds.zarr", cache=cache)
    assert (cache / "notes").is_dir() and not (cache / "v1").exists()


def test_an_episode_with_a_chunk_lost_uncounted_is_from_a_damaged_file() -> None:
    # Without a message index after a damaged chunk, its lost messages cannot be counted: the
    # episode has a damage warning and no lost_messages, and still came from a damaged file.
    def episode(warnings, lost=None):
        return {
            "dropped": {},
            "camera_gaps": 0,
            "lost_messages": lost or {},
            "read_stopped": None,
            "warnings": warnings,
            "resample_offset_ms": None,
        }

    result = ConversionResult(
        episodes=[
            episode([DAMAGE_WARNING + "chunk at byte 900: CRC mismatch; lost messages not known"]),
            episode([], lost={"camera": 3}),
            episode(["2 camera timestamps not increasing in file order: sorted by capture time"]),
        ],
        excluded=[],
        frequency_hz=30.0,
        frames=0,
        store_bytes=0,
        store_files=0,
    )
    assert result.metrics()["episodes_from_damaged_files"] == 2
