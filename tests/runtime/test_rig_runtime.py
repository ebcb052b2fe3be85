"""The runner of a rig policy (two grippers, three cameras) against training's windows: a robot's
observation of every gripper and camera gives the batch training gave, and each gripper's chunk
is composed onto its own pose."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory
from scipy.spatial.transform import Rotation

from policypipe.dataset import layout
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import rot6d_to_matrix
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from policypipe.recordings.streams import read_streams
from policypipe.runtime.observation import Observation, ObservationError
from policypipe.runtime.predictions import (
    EXECUTED_TOPIC,
    NOT_ARRIVED,
    PREDICTED_TOPIC,
    PredictConfig,
    predict_recording,
)
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import RuntimeSpec, spec_of_training
from policypipe.serving.protocol import (
    act_message,
    chunk_from_message,
    chunk_message,
    pack,
    parse_request,
    unpack,
)
from policypipe.training.config import model_for_dataset
from tests.dataset.test_rig import CONFIG, SCENE, rig_dataset, rig_export, rows_of  # noqa: F401 - fixtures
from tests.training.conftest import WINDOW
from tests.training.test_rig_training import MODEL, rig_stats  # noqa: F401 - a fixture

HISTORY_NS = 300_000_000


@pytest.fixture(scope="module")
def rig_policy(rig_dataset, rig_stats, tmp_path_factory) -> Path:  # noqa: F811
    """An untrained rig policy saved as the train stage saves it (the runner's arithmetic does not
    depend on what the weights learned)."""
    root, _, _ = rig_dataset
    _, stats_path = rig_stats
    stats = json.loads(stats_path.read_text())
    torch.manual_seed(0)
    policy = DiffusionPolicy(model_for_dataset(MODEL, stats))
    policy.fit_normalizers(stats)
    folder = tmp_path_factory.mktemp("rig_policy") / "policy"
    spec = spec_of_training(dict(root.attrs), stats, sha256_file(stats_path))
    save_policy(folder, policy, {}, spec.to_json())
    return folder


@pytest.fixture(scope="module")
def rig_runner(rig_policy: Path) -> PolicyRunner:
    return PolicyRunner.load(rig_policy)


def robot_observation(vio: Path, t_ns: int, camera_lead_ns: int = 0) -> dict[str, np.ndarray]:
    """A robot's fields at the frame of camera 0 captured at `t_ns`: every camera's frames up to
    t + `camera_lead_ns`, every gripper's samples up to the first at or after t."""
    streams = read_streams(vio, CONFIG.topics, CONFIG.grippers, CONFIG.cameras)
    fields: dict[str, np.ndarray] = {}
    for k, camera in streams.cameras.items():
        order = np.argsort(camera.ns)
        ns = camera.ns[order]
        keep = (ns <= t_ns + (camera_lead_ns if k else 0)) & (ns >= t_ns - HISTORY_NS)
        if not keep.any():  # a camera this recording lacks: a robot without it sends nothing
            continue
        frames = [
            cv2.imdecode(np.frombuffer(camera.data[j], np.uint8), cv2.IMREAD_COLOR) for j in order[keep]
        ]
        prefix = "" if k == 0 else f"camera{k}_"
        fields[prefix + "frame_ns"] = ns[keep]
        fields[prefix + "frames"] = np.stack([cv2.cvtColor(f, cv2.COLOR_BGR2RGB) for f in frames])
    for i, gripper in streams.grippers.items():
        prefix = "" if i == 0 else f"robot{i}_"
        for name, times, values in (
            ("pose", gripper.pose_ns, (gripper.position, gripper.quaternion)),
            ("width", gripper.width_ns, (gripper.width,)),
        ):
            keep = (times >= t_ns - HISTORY_NS) & (np.arange(len(times)) <= np.searchsorted(times, t_ns))
            fields[f"{prefix}{name}_ns"] = times[keep]
            for field, array in zip(("position", "quaternion") if name == "pose" else ("width",), values):
                fields[prefix + field] = array[keep]
    return fields


def anchors_and_times(root, result, episode: int, stride: int = 11) -> list[tuple[int, int, int]]:
    """(dataset item, anchor row, capture time of the anchor's camera 0 frame) of one episode."""
    data = WindowDataset(Path(root.store.root), [episode], WINDOW)
    rows, t_ns, _ = rows_of(root, result, result.episodes[episode]["stem"])
    return [(i, int(a), int(t_ns[a - rows.start])) for i, a in enumerate(data.anchors)][::stride]


def vio_of(rig_export, record: dict) -> Path:  # noqa: F811
    return rig_export[0] / f"{record['stem']}_vio.mcap"


def one_anchor(rig_export, rig_dataset) -> tuple[dict, int, int, dict[str, np.ndarray]]:  # noqa: F811
    """Episode 0's record, an anchor row of it, its capture time and a robot's fields there."""
    root, result, _ = rig_dataset
    record = result.episodes[0]
    _, anchor, t = anchors_and_times(root, result, 0)[1]
    return record, anchor, t, robot_observation(vio_of(rig_export, record), t)


def test_a_robots_observation_of_every_gripper_and_camera_gives_trainings_batch(
    rig_export,  # noqa: F811
    rig_dataset,  # noqa: F811
    rig_runner: PolicyRunner,
) -> None:
    root, result, _ = rig_dataset
    checked = 0
    for episode, record in enumerate(result.episodes):
        vio = vio_of(rig_export, record)
        data = WindowDataset(Path(root.store.root), [episode], WINDOW)
        for i, anchor, t in anchors_and_times(root, result, episode):
            # Given the other cameras' frames a moment after t, the runner chooses as convert did.
            fields = robot_observation(vio, t, camera_lead_ns=round(CONFIG.max_camera_offset_ms * 1e6))
            batch, t_seen, anchors = rig_runner.prepare(
                Observation.checked(**fields), episode_start_ns=record["start_ns"]
            )
            item = data[i]
            assert t_seen == t and set(batch) == set(item) - {"action"}
            for name in item:
                if name.startswith(("obs_images", "obs_valid")):
                    assert torch.equal(batch[name][0], item[name]), (episode, anchor, name)
            torch.testing.assert_close(batch["obs_pose"][0], item["obs_pose"], atol=2e-6, rtol=0)
            torch.testing.assert_close(batch["obs_width"][0], item["obs_width"], atol=1e-7, rtol=0)
            # Each gripper's anchor is its own pose at t, as the dataset holds it (float32).
            for g, gripper_anchor in anchors.items():
                np.testing.assert_allclose(
                    gripper_anchor.position, root[layout.eef_pos(g)][anchor], atol=2e-6
                )
            checked += 1
    assert checked >= 6


def test_each_grippers_chunk_is_composed_onto_its_own_pose(
    rig_export,  # noqa: F811
    rig_dataset,  # noqa: F811
    rig_runner: PolicyRunner,
) -> None:
    root = rig_dataset[0]
    record, anchor, _, fields = one_anchor(rig_export, rig_dataset)
    observation = Observation.checked(**fields)
    chunk = rig_runner.act(observation, seed=3, episode_start_ns=record["start_ns"])
    assert set(chunk.grippers) == {0, 1} and chunk.relative.shape == (WINDOW.horizon, 20)
    for g in (0, 1):
        relative = chunk.relative[:, 10 * g : 10 * g + 10]
        r_t = Rotation.from_rotvec(root[layout.eef_rot(g)][anchor].astype(np.float64)).as_matrix()
        targets = chunk.grippers[g]
        np.testing.assert_allclose(
            targets.position, root[layout.eef_pos(g)][anchor] + relative[:, :3] @ r_t.T, atol=2e-6
        )
        rotation = Rotation.from_quat(targets.quaternion).as_matrix()
        np.testing.assert_allclose(rotation, r_t @ rot6d_to_matrix(relative[:, 3:9]), atol=2e-6)
        lo, hi = rig_runner.spec.width_ranges_m[g]
        assert ((targets.width >= lo) & (targets.width <= hi)).all()
    assert np.array_equal(chunk.position, chunk.grippers[0].position)  # format 1's names: gripper 0
    # Through the server's protocol and back, every gripper's targets arrive.
    served = chunk_from_message(unpack(pack(chunk_message(chunk, 1.0))))
    for g in (0, 1):
        assert np.array_equal(served.grippers[g].position, chunk.grippers[g].position)
    request = parse_request(unpack(pack(act_message(observation, seed=3))))
    again = rig_runner.act(
        Observation.checked(**request.observation), seed=3, episode_start_ns=record["start_ns"]
    )
    assert np.array_equal(again.relative, chunk.relative)


def test_a_camera_not_sent_is_absent_for_every_step_and_a_gripper_not_sent_is_refused(
    rig_export,  # noqa: F811
    rig_dataset,  # noqa: F811
    rig_runner: PolicyRunner,
) -> None:
    _, _, _, fields = one_anchor(rig_export, rig_dataset)
    without_scene = {k: v for k, v in fields.items() if not k.startswith(f"camera{SCENE}_")}
    batch, _, _ = rig_runner.prepare(Observation.checked(**without_scene))
    assert not batch[f"obs_valid_camera{SCENE}"].any() and batch["obs_valid_camera1"].all()
    without_gripper1 = {k: v for k, v in fields.items() if not k.startswith("robot1_")}
    with pytest.raises(ObservationError, match="lacks gripper 1"):
        rig_runner.act(Observation.checked(**without_gripper1))
    with pytest.raises(ObservationError, match="camera 5, which the policy was not trained on"):
        rig_runner.act(
            Observation.checked(
                **fields, camera5_frame_ns=fields["frame_ns"], camera5_frames=fields["frames"]
            )
        )
    with pytest.raises(ObservationError, match="gripper 1 lacks robot1_width"):
        Observation.checked(**{k: v for k, v in fields.items() if k != "robot1_width"})
    with pytest.raises(ObservationError, match="unknown observation field 'camera0_frames'"):
        Observation.checked(**fields, camera0_frames=fields["frames"])


def test_the_spec_names_every_gripper_camera_and_opening_and_an_older_spec_still_reads(
    rig_runner: PolicyRunner, tmp_path: Path
) -> None:
    spec = rig_runner.spec
    assert (spec.grippers, spec.cameras) == ((0, 1), (0, 1, SCENE))
    assert set(spec.camera_topics) == {"/camera0/image", "/camera1/image", f"/camera{SCENE}/image"}
    assert len(spec.width_ranges_m) == 2 and spec.max_camera_offset_ms == CONFIG.max_camera_offset_ms
    one = replace(spec, grippers=(0,), cameras=(0,), width_ranges_m=spec.width_ranges_m[:1])
    raw = one.to_json()
    for key in ("grippers", "cameras", "width_ranges_m", "max_camera_offset_ms"):
        del raw[key]
    (tmp_path / "runtime.json").write_text(
        json.dumps(raw | {"format": 1, "width_range_m": one.width_range_m})
    )
    old = RuntimeSpec.read(tmp_path)
    assert (old.grippers, old.cameras, old.width_range_m) == ((0,), (0,), one.width_range_m)


def predicted_poses(path: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Per topic of a predictions MCAP: (log time, the poses' positions (H, 3)), in file order."""
    factory, topics = DecoderFactory(), {}
    with open(path, "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=False):
            if channel.message_encoding == "protobuf":
                poses = factory.decoder_for("protobuf", schema)(message.data).poses
                position = np.array([[p.position.x, p.position.y, p.position.z] for p in poses])
                topics.setdefault(channel.topic, []).append((message.log_time, position))
        f.seek(0)
        topics["metadata"] = {m.name: m.metadata for m in make_reader(f).iter_metadata()}
    return topics


@pytest.mark.parametrize("stem", ["a", "b"])  # b: the scene camera unplugged
def test_predict_replays_a_rig_recording_with_every_gripper_and_camera_as_a_robot_would(
    rig_export,  # noqa: F811
    rig_dataset,  # noqa: F811
    rig_policy: Path,
    rig_runner: PolicyRunner,
    tmp_path: Path,
    stem: str,
) -> None:
    root, result, _ = rig_dataset
    record = next(r for r in result.episodes if r["stem"] == stem)
    vio = vio_of(rig_export, record)
    out = tmp_path / "predictions.mcap"
    summary = predict_recording(rig_policy, vio, out, PredictConfig(seed=5, every=7))
    topics = predicted_poses(out)

    # The episode starts where convert started it; gripper 1's poses end 0.15 s before the
    # recording, and the frames after them give no chunk.
    assert summary.observation_ns[0] == record["start_ns"] and summary.chunks >= 8
    assert summary.skipped[NOT_ARRIVED] > 0
    assert (stem == "b") == any(f"camera {SCENE} has no frames" in w for w in summary.warnings)
    metadata = topics["metadata"]["policypipe.predict"]
    assert (metadata["grippers"], metadata["cameras"]) == ("0,1", f"0,1,{SCENE}")
    lead = round(CONFIG.max_camera_offset_ms * 1e6)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as predict runs the policy
    try:
        for i, t in enumerate(summary.observation_ns):
            # Given every camera's frames up to convert's offset after t, the runner chose as convert.
            fields = robot_observation(vio, t, camera_lead_ns=lead)
            chunk = rig_runner.act(
                Observation.checked(**fields), seed=5 + i, episode_start_ns=record["start_ns"]
            )
            for g, prefix in ((0, ""), (1, "/robot1")):
                for topic, steps in (
                    (PREDICTED_TOPIC, WINDOW.horizon),
                    (EXECUTED_TOPIC, WINDOW.n_action_steps),
                ):
                    log_time, position = topics[prefix + topic][i]
                    assert log_time == t
                    np.testing.assert_array_equal(position, chunk.grippers[g].position[:steps])
    finally:
        torch.set_num_threads(previous)
