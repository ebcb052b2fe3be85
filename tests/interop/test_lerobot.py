"""The LeRobotDataset v3.0 export read back by the format alone (pyarrow, PyAV) and compared with
the zarr dataset, frame by frame and value by value."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

from policypipe.dataset import layout
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.fingerprint import fingerprint
from policypipe.dataset.frame_shards import FrameShardReader
from policypipe.interop.lerobot import (
    DATA_PATH,
    EPISODES_PATH,
    VIDEO_PATH,
    ExportError,
    LeRobotExportConfig,
    export_lerobot,
)
from policypipe.lineage.hashing import sha256_file
from policypipe.synthetic.export import SampleConfig, write_sample_export
from tests.dataset.test_convert import convert

FPS = 30
CONFIG = ConvertConfig(image_size=(32, 24), min_frames=10, workers=1, resample_hz=float(FPS))
TASK = "pick the block and place it on the mark"
KEY = "observation.images.camera0"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lerobot")
    export = write_sample_export(root / "raw", SampleConfig(recordings=3, seed=11, defects=False)).root
    convert(export, root / "ds.zarr", CONFIG)
    export_lerobot(root / "ds.zarr", root / "out", LeRobotExportConfig(task=TASK))
    return root / "ds.zarr", root / "out"


def decoded_video(path: Path) -> tuple[list[np.ndarray], list[float]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames, times = [], []
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.pts * stream.time_base))
    return frames, times


def test_every_frame_and_value_is_the_datasets_on_the_grid(exported) -> None:
    store, out = exported
    root = zarr.open_group(store, mode="r")
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and isinstance(info["fps"], int)
    assert info["policypipe"]["dataset_fingerprint"] == fingerprint(root).digest
    assert info["policypipe"]["stats_sha256"] == sha256_file(out / "meta/stats.json")
    data = pq.read_table(out / DATA_PATH.format(chunk_index=0, file_index=0))
    kind = data.schema.field("observation.state").type  # datasets' Sequence(length=7, float32)
    assert pa.types.is_fixed_size_list(kind) and kind.list_size == 7 and kind.value_type == pa.float32()
    n = data.num_rows
    assert info["total_frames"] == n and info["total_episodes"] == 3
    frame_index = data["frame_index"].to_numpy()
    episode_index = data["episode_index"].to_numpy()
    np.testing.assert_array_equal(data["index"].to_numpy(), np.arange(n))
    np.testing.assert_array_equal(data["timestamp"].to_numpy(), (frame_index / FPS).astype(np.float32))
    state = np.stack(data["observation.state"].to_numpy(zero_copy_only=False))
    action = np.stack(data["action"].to_numpy(zero_copy_only=False))

    # Each dataset row sits in its own grid slot: its values and its frame there, exactly.
    ends = root[layout.EPISODE_ENDS][:]
    starts = np.concatenate([[0], ends[:-1]])
    stamps = root[layout.TIMESTAMP][:]
    pos, rot, width = root[layout.EEF_POS][:], root[layout.EEF_ROT][:], root[layout.GRIPPER_WIDTH][:]
    frames, times = decoded_video(out / VIDEO_PATH.format(video_key=KEY, chunk_index=0, file_index=0))
    assert len(frames) == n
    # LeRobot's decoder looks frame i up at i / fps, within 1e-4 s.
    assert np.abs(np.array(times) - np.arange(n) / FPS).max() < 1e-4
    stored = FrameShardReader(store, layout.RGB)
    filled = 0
    for e, (a, b) in enumerate(zip(starts, ends)):
        mine = np.flatnonzero(episode_index == e)
        slot = np.rint((stamps[a:b] - stamps[a]) * FPS).astype(int)
        assert len(mine) == slot[-1] + 1
        filled += len(mine) - (b - a)
        for r, s in zip(range(a, b), slot):
            i = mine[s]
            assert frame_index[i] == s
            np.testing.assert_array_equal(state[i], np.concatenate([pos[r], rot[r], width[r]]))
            # H.264 at crf 18 (yuv420p halves the colour resolution of these 32 x 24 frames)
            # against the stored JPEG; and the frame is the row's, not a neighbour's.
            errors = {
                q: np.abs(frames[i].astype(int) - stored.read(q).astype(int)).mean()
                for q in (r - 1, r, r + 1)
                if a <= q < b
            }
            assert errors[r] < 6, (e, s, errors)
            apart = [
                q
                for q in errors
                if q != r
                and np.abs(stored.read(q).astype(int) - stored.read(r).astype(int)).mean() > 3 * errors[r]
            ]
            assert all(errors[r] < errors[q] for q in apart), (e, s, errors)
        # The action is the next frame's state, the last frame's its own.
        np.testing.assert_array_equal(action[mine[:-1]], state[mine[1:]])
        np.testing.assert_array_equal(action[mine[-1]], state[mine[-1]])
    assert filled == info["policypipe"]["filled_slots"] > 0  # the sample drops 1-3 % of its frames


def test_the_meta_files_are_what_lerobots_loader_reads(exported) -> None:
    _, out = exported
    episodes = pq.read_table(out / EPISODES_PATH).to_pydict()
    assert episodes["episode_index"] == [0, 1, 2] and episodes["tasks"] == [[TASK]] * 3
    ends = np.cumsum(episodes["length"])
    assert episodes["dataset_to_index"] == ends.tolist()
    assert episodes["dataset_from_index"] == (ends - episodes["length"]).tolist()
    assert episodes[f"videos/{KEY}/from_timestamp"] == pytest.approx((ends - episodes["length"]) / FPS)
    tasks = pq.read_table(out / "meta/tasks.parquet")
    assert tasks.schema.pandas_metadata["index_columns"] == ["task"]
    assert tasks["task"].to_pylist() == [TASK] and tasks["task_index"].to_pylist() == [0]
    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats["observation.state"]) >= {"min", "max", "mean", "std", "count", "q01", "q99"}
    assert np.array(stats[KEY]["mean"]).shape == (3, 1, 1) and 0 < stats[KEY]["mean"][0][0][0] < 1
    assert stats["action"]["count"] == [json.loads((out / "meta/info.json").read_text())["total_frames"]]


def test_the_export_is_byte_identical_when_repeated(exported, tmp_path: Path) -> None:
    store, out = exported
    again = tmp_path / "again"
    export_lerobot(store, again, LeRobotExportConfig(task=TASK))
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f


def test_a_dataset_off_a_grid_or_an_existing_folder_is_refused(exported, tmp_path: Path) -> None:
    store, out = exported
    with pytest.raises(ExportError, match="exists"):
        export_lerobot(store, out, LeRobotExportConfig(task=TASK))
    root = tmp_path / "clock"
    export = write_sample_export(root / "raw", SampleConfig(recordings=1, seed=3, defects=False)).root
    convert(export, root / "ds.zarr", replace(CONFIG, resample_hz=None))
    with pytest.raises(ExportError, match=r"convert.resample_hz"):
        export_lerobot(root / "ds.zarr", root / "out", LeRobotExportConfig(task=TASK))
    assert not (root / "out").exists() and not (root / "out.partial").exists()
    # Refused while writing (H.264's yuv420p needs even sizes): nothing half-written is left.
    convert(export, root / "odd.zarr", replace(CONFIG, image_size=(31, 24)))
    with pytest.raises(ExportError, match="even"):
        export_lerobot(root / "odd.zarr", root / "out", LeRobotExportConfig(task=TASK))
    assert not (root / "out").exists() and not (root / "out.partial").exists()


def test_a_joint_space_dataset_exports_its_joints_and_commands_on_the_control_clock(tmp_path: Path) -> None:
    from tests.recordings.aloha_files import convert_aloha

    store, written = convert_aloha(tmp_path / "aloha", episodes=3)
    export_lerobot(store, tmp_path / "out", LeRobotExportConfig(task="fold the towel"))
    root = zarr.open_group(store, mode="r")
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["fps"] == 50 and info["total_frames"] == sum(len(w["qpos"]) for w in written)
    assert info["features"]["observation.state"]["names"] == root.attrs[layout.ATTRS_JOINT_NAMES]
    assert set(info["features"]) >= {"observation.images.camera0", "observation.images.camera1"}
    data = pq.read_table(tmp_path / "out" / DATA_PATH.format(chunk_index=0, file_index=0))
    state = np.stack(data["observation.state"].to_numpy(zero_copy_only=False))
    action = np.stack(data["action"].to_numpy(zero_copy_only=False))
    # The rows are the files' control steps: the file's qpos and its recorded command, row by row.
    np.testing.assert_array_equal(state, np.concatenate([w["qpos"] for w in written]).astype(np.float32))
    np.testing.assert_array_equal(action, np.concatenate([w["action"] for w in written]).astype(np.float32))
    frame_index = data["frame_index"].to_numpy()
    np.testing.assert_array_equal(data["timestamp"].to_numpy(), (frame_index / 50).astype(np.float32))
    sidecar = json.loads((tmp_path / "out/meta/policypipe.json").read_text())
    assert sidecar["representation"]["action"] == "the command recorded at the frame (action), absolute"
    assert sidecar["episodes"][2]["source"] == {"format": "aloha", "path": "episode_2.hdf5"}
