"""The runner against the pipeline's own path: real sample recordings converted by `convert`, the
statistics of `stats`, a policy saved as the train stage saves it, and eval's samples."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import zarr
from scipy.spatial.transform import Rotation

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import PoseInterpolator
from policypipe.dataset.stats import StatsConfig, compute_statistics
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.dataset.windows import WindowConfig, rot6d_to_matrix
from policypipe.evaluation.samples import collect_samples
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from policypipe.recordings.layout import Role
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.recordings.streams import read_streams
from policypipe.runtime.observation import Observation, ObservationError
from policypipe.runtime.runner import GripperAnchor, PolicyRunner
from policypipe.runtime.spec import RuntimeSpec, spec_of_training
from policypipe.synthetic.export import SampleConfig, write_sample_export
from tests.training.conftest import MODEL

IMAGE_SIZE = (32, 24)
POLICY = dataclasses.replace(MODEL, image_size=IMAGE_SIZE, crop_size=(28, 20))
WINDOW = WindowConfig(POLICY.n_obs_steps, POLICY.horizon, POLICY.n_action_steps)


@dataclasses.dataclass
class Pipeline:
    store: Path
    policy: Path
    stats: dict
    recordings: dict[int, Path]  # episode index -> its _vio.mcap


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Pipeline:
    """Three sample recordings through convert and stats, and an untrained policy (the runner's
    arithmetic does not depend on what the weights learned) saved as the train stage saves it."""
    return tiny_pipeline(tmp_path_factory.mktemp("runtime"), 3, 5, StatsConfig(val_fraction=0.34))


def tiny_pipeline(root: Path, recordings: int, seed: int, stats_config: StatsConfig) -> Pipeline:
    """`recordings` sample recordings (the generator's `seed`) through pair, convert and stats, and an
    untrained policy saved as the train stage saves it, in `root`."""
    export = write_sample_export(
        root / "raw", SampleConfig(recordings=recordings, seed=seed, defects=False)
    ).root
    result = pair_export(export, PairConfig())
    write_json_atomic(root / "manifest.json", result.manifest())
    convert_dataset(
        root / "manifest.json", export, root / "ds.zarr", root / "cache", ConvertConfig(image_size=IMAGE_SIZE)
    )
    dataset = zarr.open_group(root / "ds.zarr", mode="r")
    stats = compute_statistics(dataset, WINDOW, stats_config)
    stats["dataset_fingerprint"] = {"sha256": "d" * 64}
    write_json_atomic(root / "stats.json", stats)
    torch.manual_seed(0)
    policy = DiffusionPolicy(POLICY)
    policy.fit_normalizers(stats)
    spec = spec_of_training(dict(dataset.attrs), stats, sha256_file(root / "stats.json"))
    save_policy(root / "policy", policy, {}, spec.to_json())
    stems = [ep["stem"] for ep in dataset.attrs[layout.ATTRS_EPISODES]]
    vio = {r.stem: export / r.files[Role.VIO].path for r in result.recordings}
    return Pipeline(root / "ds.zarr", root / "policy", stats, {i: vio[s] for i, s in enumerate(stems)})


def robot_observation(vio: Path, t_ns: int, history_s: float = 0.2) -> Observation:
    """What a robot would have at the frame captured at `t_ns`: its recent camera frames decoded
    at full resolution, and the pose and width samples up to the first one at or after t."""
    streams = read_streams(vio, ConvertConfig().topics)
    order = np.argsort(streams.camera_ns)
    frame_ns = streams.camera_ns[order]
    keep = (frame_ns <= t_ns) & (frame_ns >= t_ns - history_s * 1e9)
    frames = np.stack(
        [
            cv2.cvtColor(
                cv2.imdecode(np.frombuffer(streams.camera_data[i], np.uint8), cv2.IMREAD_COLOR),
                cv2.COLOR_BGR2RGB,
            )
            for i in order[keep]
        ]
    )

    def upto_first_after(times: np.ndarray) -> np.ndarray:
        last = np.searchsorted(times, t_ns)  # the first sample at or after t
        return (times >= t_ns - history_s * 1e9) & (np.arange(len(times)) <= last)

    p, w = upto_first_after(streams.pose_ns), upto_first_after(streams.width_ns)
    return Observation.checked(
        frame_ns[keep], frames, streams.pose_ns[p], streams.position[p], streams.quaternion[p],
        streams.width_ns[w], streams.width[w],
    )  # fmt: skip


def episode_start_ns(pipeline: Pipeline, episode: int) -> int:
    return int(zarr.open_group(pipeline.store, mode="r").attrs[layout.ATTRS_EPISODES][episode]["start_ns"])


def anchor_capture_ns(pipeline: Pipeline, episode: int, frame: int) -> int:
    """The capture time of a stored frame: its episode's kept frames are the recording's camera
    frames from the first kept one on (sample recordings without defects drop none inside; a frame
    at either end may fall outside the pose's span)."""
    record = zarr.open_group(pipeline.store, mode="r").attrs[layout.ATTRS_EPISODES][episode]
    assert set(record["dropped"]) <= {"outside_pose_or_width_span"}
    camera_ns = np.sort(read_streams(pipeline.recordings[episode], ConvertConfig().topics).camera_ns)
    first = int(np.searchsorted(camera_ns, record["start_ns"]))
    ends = zarr.open_group(pipeline.store, mode="r")[layout.EPISODE_ENDS][:]
    start_row = 0 if episode == 0 else int(ends[episode - 1])
    return int(camera_ns[first + frame - start_row])


def test_the_runner_sees_what_eval_sees_and_its_targets_are_evals_chunks_composed_onto_the_pose(
    pipeline: Pipeline,
) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    val = pipeline.stats["split"]["val"]
    samples = collect_samples(pipeline.store, val, WINDOW, stride=7)
    root = zarr.open_group(pipeline.store, mode="r")
    eef_pos, eef_rot = root[layout.EEF_POS][:], root[layout.EEF_ROT][:]
    checked = 0
    for i, (episode, anchor) in enumerate(zip(samples.episodes, samples.anchors)):
        t = anchor_capture_ns(pipeline, int(episode), int(anchor))
        batch, t_seen, _ = runner.prepare(
            robot_observation(pipeline.recordings[int(episode)], t), episode_start_ns(pipeline, int(episode))
        )
        assert t_seen == t
        # The same frames, bit for bit: resize and JPEG round trip as convert stored them.
        assert torch.equal(batch["obs_images"][0], samples.batch["obs_images"][i])
        # The same features, to float32 rounding (eval interpolates on the dataset's shared time axis).
        torch.testing.assert_close(batch["obs_pose"][0], samples.batch["obs_pose"][i], atol=2e-6, rtol=0)
        torch.testing.assert_close(batch["obs_width"][0], samples.batch["obs_width"][i], atol=1e-7, rtol=0)

        eval_batch = {k: v[i : i + 1] for k, v in samples.batch.items() if k != "action"}
        relative = (
            runner.policy.predict_action(eval_batch, torch.Generator().manual_seed(i))[0].double().numpy()
        )
        chunk = runner.act(
            robot_observation(pipeline.recordings[int(episode)], t),
            seed=i,
            episode_start_ns=episode_start_ns(pipeline, int(episode)),
        )
        np.testing.assert_allclose(chunk.relative, relative, atol=1e-5)
        # Composed onto the recorded pose at t (the dataset's frame pose, float32).
        r_t = Rotation.from_rotvec(eef_rot[anchor].astype(np.float64)).as_matrix()
        expected = eef_pos[anchor] + relative[:, :3] @ r_t.T
        np.testing.assert_allclose(chunk.position, expected, atol=2e-6)
        rotation = Rotation.from_quat(chunk.quaternion).as_matrix()
        np.testing.assert_allclose(rotation, r_t @ rot6d_to_matrix(relative[:, 3:9]), atol=2e-6)
        step_ns = 1e9 / runner.spec.frequency_hz
        np.testing.assert_allclose(chunk.time_ns - t, (np.arange(WINDOW.horizon) + 1) * step_ns, atol=1)
        assert chunk.execute.tolist() == [k < WINDOW.n_action_steps for k in range(WINDOW.horizon)]
        checked += 1
    assert checked >= 5


def test_a_policy_that_remembers_its_start_reads_the_first_request_as_training_read_the_first_frame(
    pipeline: Pipeline,
) -> None:
    # remember_release: the first request of an episode is kept (camera 0's training frame, the pose),
    # and every later request reads it as training read the episode's first frame.
    config = dataclasses.replace(POLICY, event_loss_weight=1.0, remember_release=True)
    policy = DiffusionPolicy(config)
    policy.fit_normalizers(pipeline.stats)
    runner = PolicyRunner(policy, RuntimeSpec.read(pipeline.policy))
    episode = int(pipeline.stats["split"]["val"][0])
    data = WindowDataset(pipeline.store, [episode], WINDOW, episode_start=True)
    start = episode_start_ns(pipeline, episode)
    vio = pipeline.recordings[episode]
    first_row, later = int(data.anchors[0]), len(data) // 2
    assert first_row == int(data.streams.first[episode])
    runner.prepare(robot_observation(vio, anchor_capture_ns(pipeline, episode, first_row)), start)
    t = anchor_capture_ns(pipeline, episode, int(data.anchors[later]))
    batch, _, _ = runner.prepare(robot_observation(vio, t), start)
    item = data[later]
    assert torch.equal(batch["start_image"][0], item["start_image"])
    torch.testing.assert_close(batch["start_pose"][0], item["start_pose"], atol=2e-6, rtol=0)
    assert item["start_pose"][0, :3].norm() > 0.01  # the gripper has moved since the start
    # A new episode (another start time) is a new memory: its first request is kept ...
    again, _, _ = runner.prepare(robot_observation(vio, t), start + 1)
    assert torch.equal(again["start_image"], batch["obs_images"][:, -1])
    torch.testing.assert_close(again["start_pose"][0, 0], torch.tensor([0.0] * 3 + [1, 0, 0, 0, 1, 0]))
    # ... as is the first request after the clock went back (an episode replayed from the same start).
    runner.prepare(robot_observation(vio, t), start)
    back, _, _ = runner.prepare(
        robot_observation(vio, anchor_capture_ns(pipeline, episode, first_row)), start
    )
    torch.testing.assert_close(back["start_pose"][0, 0], torch.tensor([0.0] * 3 + [1, 0, 0, 0, 1, 0]))
    # A request that does not say which episode it is of is refused in words.
    with pytest.raises(ObservationError, match="pass episode_start_ns"):
        runner.prepare(robot_observation(vio, t))


def test_absolute_errors_against_the_recorded_future_equal_the_offline_ones(pipeline: Pipeline) -> None:
    """Offline, eval compares a relative chunk with the recorded relative future; driven, a robot
    would compare the absolute targets with where the gripper was recorded at those times. A
    rotation keeps lengths, so the two position errors must be the same numbers."""
    runner = PolicyRunner.load(pipeline.policy)
    val = pipeline.stats["split"]["val"]
    samples = collect_samples(pipeline.store, val, WINDOW, stride=9)
    for i, (episode, anchor) in enumerate(zip(samples.episodes, samples.anchors)):
        t = anchor_capture_ns(pipeline, int(episode), int(anchor))
        chunk = runner.act(
            robot_observation(pipeline.recordings[int(episode)], t),
            seed=i,
            episode_start_ns=episode_start_ns(pipeline, int(episode)),
        )
        offline = np.linalg.norm(
            chunk.relative[:, :3] - samples.batch["action"][i, :, :3].double().numpy(), axis=1
        )
        streams = read_streams(pipeline.recordings[int(episode)], ConvertConfig().topics)
        truth = PoseInterpolator(
            (streams.pose_ns - t) / 1e9, streams.position, Rotation.from_quat(streams.quaternion)
        )((chunk.time_ns - t) / 1e9)[0]
        inside = chunk.time_ns <= streams.camera_ns.max()  # eval pads past the episode's last frame
        driven = np.linalg.norm(chunk.position - truth, axis=1)
        np.testing.assert_allclose(driven[inside], offline[inside], atol=5e-6)


def validation_observation(pipeline: Pipeline) -> tuple[Observation, int]:
    """What a robot has at a validation sample's frame, and that frame's capture time t."""
    episode = pipeline.stats["split"]["val"][0]
    t = anchor_capture_ns(
        pipeline, episode, int(collect_samples(pipeline.store, [episode], WINDOW, 5).anchors[2])
    )
    return robot_observation(pipeline.recordings[episode], t), t


def test_steps_already_past_are_marked_and_not_executed(pipeline: Pipeline) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    obs, t = validation_observation(pipeline)
    late = runner.act(obs, now_ns=t + int(2.5e9 / runner.spec.frequency_hz), seed=1)
    assert late.past.tolist() == [k < 2 for k in range(WINDOW.horizon)]
    assert late.execute.tolist() == [2 <= k < WINDOW.n_action_steps for k in range(WINDOW.horizon)]
    on_time = runner.act(obs, now_ns=t, seed=1)
    assert not on_time.past.any() and np.array_equal(on_time.position, late.position)  # same seed, same chunk


def test_the_width_target_stays_within_the_training_openings(pipeline: Pipeline) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    lo, hi = runner.spec.width_range_m
    anchor = {0: GripperAnchor(np.zeros(3), np.eye(3), hi)}
    chunk = runner.compose(np.tile([0, 0, 0, 1, 0, 0, 0, 1, 0, 0.5], (WINDOW.horizon, 1)), 0, anchor, None)
    assert (chunk.width == hi).all() and lo < hi


def test_the_deadband_holds_a_small_opening_at_the_reading_and_passes_closing_and_real_openings(
    pipeline: Pipeline, tmp_path
) -> None:
    plain = PolicyRunner.load(pipeline.policy)
    spec = dataclasses.replace(plain.spec, open_deadband_m=0.010)
    runner = PolicyRunner(plain.policy, spec)
    reading = 0.030  # fingers closed on a block
    anchor = {0: GripperAnchor(np.zeros(3), np.eye(3), reading)}
    asked = np.array([-0.004, 0.0, 0.002, 0.0099, 0.010, 0.030, 0.004, -0.001])  # dw per step
    relative = np.tile([0, 0, 0, 1, 0, 0, 0, 1, 0, 0.0], (WINDOW.horizon, 1))
    relative[: len(asked), 9] = asked
    width = runner.compose(relative, 0, anchor, None).width[: len(asked)]
    np.testing.assert_allclose(width, reading + np.array([-0.004, 0, 0, 0, 0.010, 0.030, 0, -0.001]))
    # Without a deadband (the default, and every spec written before it), the width as asked.
    np.testing.assert_allclose(plain.compose(relative, 0, anchor, None).width[: len(asked)], reading + asked)
    # The spec carries it to every runner of the exported policy (server, predictions, rollouts).
    save_policy(tmp_path / "policy", plain.policy, {}, spec.to_json())
    assert RuntimeSpec.read(tmp_path / "policy").open_deadband_m == 0.010
    old = spec.to_json()
    del old["open_deadband_m"]
    (tmp_path / "policy" / "runtime.json").write_text(json.dumps(old))
    assert RuntimeSpec.read(tmp_path / "policy").open_deadband_m == 0.0


def test_the_runner_takes_the_grippers_report_at_the_latest_frame(pipeline: Pipeline) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    observation, _ = validation_observation(pipeline)
    gripper = observation.grippers[0]
    after = gripper.width_ns > observation.frame_ns[-1]  # the sample after t that covers it is sent too
    assert after.any() and not after.all()

    def anchored(holding: np.ndarray | None) -> bool | None:
        reported = dataclasses.replace(gripper, holding=holding)
        return runner.prepare(dataclasses.replace(observation, grippers={0: reported}))[2][0].holding

    assert anchored(None) is None
    assert anchored(~after) is True  # held up to t, let go after it
    assert anchored(after) is False  # closed on it only after t


def test_the_deadband_lets_a_gripper_that_reports_holding_nothing_open(pipeline: Pipeline) -> None:
    plain = PolicyRunner.load(pipeline.policy)
    runner = PolicyRunner(plain.policy, dataclasses.replace(plain.spec, open_deadband_m=0.010))
    relative = np.tile([0, 0, 0, 1, 0, 0, 0, 1, 0, 0.004], (WINDOW.horizon, 1))  # opens 4 mm
    reading = 0.030

    def width(holding: bool | None) -> np.ndarray:
        anchor = {0: GripperAnchor(np.zeros(3), np.eye(3), reading, holding)}
        return runner.compose(relative, 0, anchor, None).width

    # A close that missed is retried by small openings; a held block, or a gripper that does not
    # say, keeps its reading.
    np.testing.assert_allclose(width(False), reading + 0.004)
    np.testing.assert_allclose(width(True), reading)
    np.testing.assert_allclose(width(None), reading)


def nan_in_row(values: np.ndarray, row: int) -> np.ndarray:
    values = values.copy()
    values[row, 1] = np.nan
    return values


def good_observation(pipeline: Pipeline) -> dict:
    episode = pipeline.stats["split"]["val"][0]
    t = anchor_capture_ns(
        pipeline, episode, int(collect_samples(pipeline.store, [episode], WINDOW, 5).anchors[2])
    )
    obs = robot_observation(pipeline.recordings[episode], t)
    return obs.fields()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda o: o | {"frames": o["frames"].transpose(0, 3, 1, 2)}, "channels first"),
        (lambda o: o | {"frames": o["frames"].astype(np.float32)}, "must be uint8 RGB"),
        (lambda o: o | {"frames": o["frames"][:, :5]}, "too small"),
        (lambda o: o | {"frame_ns": o["frame_ns"][::-1].copy(), "frames": o["frames"][::-1]}, "increase"),
        (lambda o: o | {"pose_ns": o["pose_ns"] / 1e9}, "integer nanoseconds"),
        (lambda o: o | {"position": nan_in_row(o["position"], 3)}, "NaN"),
        (lambda o: o | {"quaternion": o["quaternion"] * 1.01}, "not 1"),
        (lambda o: o | {"width": o["width"][:-1]}, "width must have shape"),
    ],
)  # fmt: skip
def test_a_bad_observation_is_refused_naming_what_is_wrong(pipeline: Pipeline, damage, says: str) -> None:
    with pytest.raises(ObservationError, match=says):
        Observation.checked(**damage(good_observation(pipeline)))


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (lambda o: o | {"frame_ns": o["frame_ns"][-1:], "frames": o["frames"][-1:]}, "the last 2 camera"),
        (lambda o: o | {k: o[k][-2:] for k in ("pose_ns", "position", "quaternion")}, "history older than"),
        (lambda o: o | {k: o[k][:-1] for k in ("width_ns", "width")}, "interpolated, never extrapolated"),
    ],
)  # fmt: skip
def test_missing_history_or_a_future_not_yet_arrived_is_refused(pipeline: Pipeline, cut, says: str) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    with pytest.raises(ObservationError, match=says):
        runner.act(Observation.checked(**cut(good_observation(pipeline))))


def test_a_policy_exported_before_the_runtime_spec_is_refused_with_what_to_do(
    pipeline: Pipeline, tmp_path
) -> None:
    torch.manual_seed(0)
    policy = DiffusionPolicy(POLICY)
    policy.fit_normalizers(pipeline.stats)
    save_policy(tmp_path / "old", policy, {})
    with pytest.raises(ValueError, match="train it again"):
        PolicyRunner.load(tmp_path / "old")
    assert RuntimeSpec.read(pipeline.policy).frequency_hz == pytest.approx(30, abs=0.1)
