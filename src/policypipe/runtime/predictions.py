"""What the policy would have done along a recording, as an MCAP for Foxglove (`policypipe predict`).

The recording's streams are fed to the runner in capture-time order, as a robot would have them:
every camera's frames decoded one at a time as a camera driver hands them over (JPEG/PNG and
H.264 at the camera's own resolution, by convert's decoder loop), and at each chunk camera 0's last
few frames, every other camera's frames up to convert's max_camera_offset_ms after camera 0's
latest (a robot waits that long for them at most; training took each camera's frame nearest
camera 0's), with every gripper's pose and width samples up to the first one at or after the
latest frame (the runner interpolates there, never extrapolates; a robot waits for that sample,
so a frame whose sample never arrives is skipped, and counted). A robot executing each chunk asks
for the next one `n_action_steps` frames later: that is the default schedule. The episode starts
at camera 0's first frame with every gripper's pose and width samples at or before it (where
`convert` starts it, on a clean recording), and every chunk passes that time as
`episode_start_ns`, as training pads the start of an episode.

Memory holds the few frames the next chunk can use, never the recording's: the compressed frames
are read from the file again as they are decoded (`recordings.streams.FramesInFile`), and only the
capture times and the pose and width samples are read ahead.

Each chunk is written three times per gripper, logged at its observation's capture time t so
that Foxglove's timeline puts it beside the frame it was computed from (gripper i >= 1's topics
under `/robot{i}`, as recording format 2 names its streams):

  /policy/predicted  foxglove.PosesInFrame  all horizon targets, frame "world", timestamp t
  /policy/executed   foxglove.PosesInFrame  the first n_action_steps of them, the ones a robot runs
  /policy/width      JSON PredictedWidth    the chunk's times, widths, executed flags and seed

and, where the policy has a monitor (`policypipe.monitor`), once per chunk:

  /policy/monitor    JSON MonitorReading    novelty, inconsistency, score (alarm above 1), alarm:
                                            plot them in Foxglove beside the frames to find the
                                            moments of a recording outside the training data

Chunk i is sampled with seed `seed + i`. The bytes are a function of the recording, the policy,
the seed and the schedule: no wall-clock time, no path, fixed writer options (the same machine and
torch threads give the same floats; another CPU may differ in the last bits).
"""

from __future__ import annotations

import io
import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from foxglove_schemas_protobuf.PosesInFrame_pb2 import PosesInFrame
from mcap.writer import CompressionType, IndexType, Writer
from mcap_protobuf.schema import build_file_descriptor_set

from policypipe.atomic import write_bytes_atomic
from policypipe.dataset.episode import covering, each_decoded_frame, measured_frequency
from policypipe.lineage.hashing import sha256_file
from policypipe.recordings.layout import McapState, mcap_state
from policypipe.recordings.messages import RecordingError, Topics
from policypipe.recordings.streams import CameraStream, GripperStreams, Streams, read_streams
from policypipe.runtime.chunk import GripperTargets
from policypipe.runtime.observation import Observation, ObservationError, field_names
from policypipe.runtime.runner import ActionChunk, PolicyRunner
from policypipe.runtime.spec import RuntimeSpec

log = logging.getLogger(__name__)

PREDICTED_TOPIC = "/policy/predicted"
EXECUTED_TOPIC = "/policy/executed"
WIDTH_TOPIC = "/policy/width"
FRAME_ID = "world"  # the recording's pose frame (recording-format.md)
WIDTH_SCHEMA = "policypipe.PredictedWidth"
MONITOR_TOPIC = "/policy/monitor"
MONITOR_SCHEMA = "policypipe.MonitorReading"
METADATA_NAME = "policypipe.predict"
# Fixed: the mcap package's version must not leak into the bytes.
LIBRARY = "policypipe-predict/1"
CHUNK_SIZE = 1024 * 1024
# A measured camera rate further than this from the policy's step rate is reported: the runner
# still picks the frames nearest each step, but the default schedule counts frames.
FREQUENCY_TOLERANCE = 0.05

FED = "fed"  # a frame that gives an observation
# Why a frame that was due for a chunk gave none (keys of PredictionSummary.skipped).
NOT_ARRIVED = "pose_or_width_not_arrived"  # no sample at or after the frame: the stream ended first
REFUSED = "observation_refused"  # the runner's ObservationError (its message in `first_refusal`)
UNDECODABLE = "undecodable_frame"  # counted for any frame, due or not: a robot never gets it


class PredictionError(ValueError):
    """Inputs predict cannot work with; the message names the file and what to do."""


@dataclass(frozen=True)
class PredictConfig:
    seed: int = 0
    every: int | None = None  # frames between two chunks; None: the policy's n_action_steps
    max_chunks: int | None = None  # stop after this many chunks
    topics: Topics = Topics()  # `convert.topics`: where the streams are
    # Intra-op threads of the policy's CPU work, pinned as train.cpu_threads is: a reduction split
    # over more threads adds in another order (params.yaml's policy: positions up to 1.2e-7 m apart
    # between 1 and 2 threads), and the bytes must not depend on the core count. A batch of one gains
    # little from more: 108 ms a chunk on 1 thread, 680 ms on 2 of a busy 2-core machine.
    threads: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise PredictionError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.every is not None and self.every < 1:
            raise PredictionError(f"every must be at least 1 frame, got {self.every}")
        if self.max_chunks is not None and self.max_chunks < 1:
            raise PredictionError(f"max_chunks must be at least 1, got {self.max_chunks}")
        if self.threads < 1:
            raise PredictionError(f"threads must be at least 1, got {self.threads}")


@dataclass
class PredictionSummary:
    recording: Path
    output: Path
    frames: int  # camera frames in the recording
    before_start: int  # frames captured before the episode could start (no pose or width yet)
    every: int
    chunks: int = 0
    observation_ns: list[int] = field(default_factory=list)  # t of each chunk written, in order
    alarms_s: list[float] = field(default_factory=list)  # the monitor's alarms, seconds from the first chunk
    skipped: Counter[str] = field(default_factory=Counter)
    first_refusal: str | None = None
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        span = (self.observation_ns[-1] - self.observation_ns[0]) / 1e9 if self.chunks else 0.0
        lines = [
            f"{self.chunks} chunks, one every {self.every} frames, over {span:.1f} s of "
            f"{self.recording.name} ({self.frames} camera frames) -> {self.output}"
        ]
        if self.alarms_s:
            lines.append(
                f"the monitor alarmed at {len(self.alarms_s)} chunk"
                + "s" * (len(self.alarms_s) != 1)
                + f", first {self.alarms_s[0]:.1f} s in ({MONITOR_TOPIC})"
            )
        if self.before_start:
            lines.append(f"{_frames(self.before_start)} before the first pose and width samples: not fed")
        for reason, count in sorted(self.skipped.items()):
            what = {
                NOT_ARRIVED: "due, but no pose or width sample at or after them ever arrived (end of "
                "recording): skipped",
                REFUSED: f"refused by the runner (first: {self.first_refusal})",
                UNDECODABLE: "undecodable: never fed, as a camera driver drops them",
            }[reason]
            lines.append(f"{_frames(count)} {what}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return lines


def _frames(count: int) -> str:
    return f"{count} frame" + "s" * (count != 1)


def predict_recording(
    policy_folder: Path,
    recording: Path,
    output: Path,
    config: PredictConfig = PredictConfig(),
    on_frame: Callable[[int, int, int], None] | None = None,
) -> PredictionSummary:
    """Streams `recording` (a `_vio.mcap`) through the policy in `policy_folder` and writes the
    predicted chunks to `output` (an MCAP, written to a temporary name and renamed).
    `on_frame(frames_done, frames_total, chunks)` is called after each camera frame. The policy
    runs on `config.threads` threads; the caller's setting is restored on return."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _predict(Path(policy_folder), Path(recording), Path(output), config, on_frame)
    finally:
        torch.set_num_threads(previous_threads)


def _predict(
    policy_folder: Path,
    recording: Path,
    output: Path,
    config: PredictConfig,
    on_frame: Callable[[int, int, int], None] | None,
) -> PredictionSummary:
    if output.resolve() == recording.resolve():
        raise PredictionError(f"the output {output} is the recording itself: write the predictions elsewhere")
    runner = _load_runner(policy_folder)
    spec = runner.spec
    streams = _read_recording(recording, config.topics, spec.grippers, spec.cameras)
    every = config.every or spec.n_action_steps

    feed = RobotFeed(streams, runner, recording)
    summary = PredictionSummary(recording, output, len(feed.order), feed.start, every)
    summary.warnings.extend(feed.warnings)

    buffer = io.BytesIO()
    out = PredictionWriter(buffer, spec.grippers, monitor=runner.monitor is not None)
    out.metadata(
        {
            "recording": recording.name,
            "recording_sha256": sha256_file(recording),
            "camera_topic": streams.camera_topic,
            **_several(spec, streams),
            "policy_manifest_sha256": sha256_file(policy_folder / "manifest.json"),
            "dataset_fingerprint": spec.dataset_fingerprint,
            "stats_sha256": spec.stats_sha256,
            "seed": str(config.seed),
            "seeds": "chunk i is sampled with seed + i",
            "every_frames": str(every),
            "max_chunks": str(config.max_chunks),
            "torch_threads": str(config.threads),
            "frequency_hz": repr(spec.frequency_hz),
            "n_action_steps": str(spec.n_action_steps),
            "horizon": str(spec.horizon),
        }
    )
    since_chunk = None  # frames fed after the last chunk's frame; None: no chunk yet
    for done, (t, state, observation) in enumerate(feed.frames(), start=1):
        if state == UNDECODABLE:
            summary.skipped[UNDECODABLE] += 1
        else:
            since_chunk = None if since_chunk is None else since_chunk + 1
            # Due: the episode's first frame, and `every` frames after the last chunk's; a due frame
            # that gives no chunk leaves the next frame due, as a robot would ask again.
            if (since_chunk is None or since_chunk >= every) and _chunk(
                feed, runner, t, state, observation, config, out, summary
            ):
                since_chunk = 0
        if on_frame is not None:
            on_frame(done, len(feed.order) - feed.start, summary.chunks)
        if config.max_chunks is not None and summary.chunks >= config.max_chunks:
            break
    if not summary.chunks:
        raise PredictionError(
            f"no chunk could be computed from {recording}: " + "; ".join(summary.lines()[1:] or ["no frames"])
        )
    out.finish()
    write_bytes_atomic(output, buffer.getvalue())
    return summary


def _chunk(
    feed: RobotFeed,
    runner: PolicyRunner,
    t: int,
    state: str,
    observation: Callable[[], Observation] | None,
    config: PredictConfig,
    out: PredictionWriter,
    summary: PredictionSummary,
) -> bool:
    """The chunk at the frame captured at t, written; False (and counted) when there is none."""
    if state == NOT_ARRIVED:
        summary.skipped[NOT_ARRIVED] += 1
        return False
    seed = config.seed + summary.chunks
    try:
        chunk = runner.act(observation(), seed=seed, episode_start_ns=feed.start_ns)
    except ObservationError as exc:
        summary.skipped[REFUSED] += 1
        summary.first_refusal = summary.first_refusal or f"frame at {t} ns: {exc}"
        return False
    out.chunk(chunk, seed)
    summary.chunks += 1
    summary.observation_ns.append(t)
    if chunk.monitor is not None and chunk.monitor.alarm:
        summary.alarms_s.append((t - summary.observation_ns[0]) / 1e9)
    return True


# ---------------------------------------------------------------- inputs


def _several(spec: RuntimeSpec, streams: Streams) -> dict[str, str]:
    """The metadata of a policy of several grippers or cameras (a policy of one has none of it)."""
    if len(spec.grippers) == 1 and len(spec.cameras) == 1:
        return {}
    return {
        "grippers": ",".join(map(str, spec.grippers)),
        "cameras": ",".join(map(str, spec.cameras)),
        "camera_topics": ",".join(
            streams.cameras[k].topic if k in streams.cameras else "" for k in spec.cameras
        ),  # "" for a camera the recording lacks
    }


def _load_runner(folder: Path) -> PolicyRunner:
    if not folder.is_dir():
        raise PredictionError(
            f"policy folder {folder} not found: pass an exported policy (data/policy: `dvc repro train` "
            "or `dvc pull data/policy`)"
        )
    return PolicyRunner.load(folder)  # a folder without runtime.json: its ValueError says what to do


def _read_recording(
    path: Path, topics: Topics, grippers: tuple[int, ...], cameras: tuple[int, ...]
) -> Streams:
    if not path.is_file():
        raise PredictionError(f"recording {path} not found: pass a recording's _vio.mcap")
    state, detail = mcap_state(path)
    if state is McapState.NOT_MCAP:
        raise PredictionError(f"{path} is {detail}: pass a recording's _vio.mcap")
    try:
        streams = read_streams(path, topics, grippers, cameras, hold_frames=False)
    except RecordingError as exc:
        several = f" (the policy drives grippers {list(grippers)})" if len(grippers) > 1 else ""
        raise RecordingError(exc.reason, f"{path}: {exc}{several}") from None
    if state is McapState.TRUNCATED:
        log.warning("%s: %s; predicting on what is readable", path.name, detail)
    return streams


class RobotFeed:
    """A recording's streams as a robot has them, camera 0's frames one by one in capture-time
    order, each with what the other cameras and the grippers have sent by then."""

    def __init__(self, streams: Streams, runner: PolicyRunner, path: Path) -> None:
        spec = runner.spec
        self.streams = streams
        self.path = path
        self.runner = runner
        self.warnings = [*([streams.truncated] if streams.truncated else []), *streams.damage]
        self.warnings.extend(streams.warnings)
        self.order = capture_order(streams.camera_ns)
        self.camera_ns = streams.camera_ns[self.order]
        self.grippers = {i: _SortedSamples.of(streams.grippers[i]) for i in spec.grippers}
        first = max(max(g.pose_ns[0], g.width_ns[0]) for g in self.grippers.values())
        self.start = int(np.searchsorted(self.camera_ns, first))  # the episode's first frame
        if self.start == len(self.camera_ns):
            what = "every gripper's" if len(self.grippers) > 1 else "the"
            raise PredictionError(
                f"{path}: every camera frame comes before {what} first pose and width samples "
                f"(frames end {(first - self.camera_ns[-1]) / 1e9:.3f} s before them): nothing to predict on"
            )
        self.start_ns = int(self.camera_ns[self.start])
        # The newest sample of every stream: a frame after one of them never gets its samples.
        self.samples_end_ns = min(min(g.pose_ns[-1], g.width_ns[-1]) for g in self.grippers.values())
        for k, camera in streams.cameras.items():
            if camera.topic not in spec.camera_topics:
                self.warnings.append(
                    f"the policy was trained on frames of {', '.join(spec.camera_topics)}; "
                    f"this recording's camera {k} is on {camera.topic}"
                )
        self.warnings.extend(
            f"camera {k} has no frames in this recording: the policy sees it absent, as training saw "
            "a recording without it"
            for k in streams.missing_cameras
        )
        if len(self.camera_ns) >= 2:
            hz = measured_frequency(self.camera_ns)
            if abs(hz / spec.frequency_hz - 1) > FREQUENCY_TOLERANCE:
                self.warnings.append(
                    f"the camera runs at {hz:.1f} Hz, the policy's steps at {spec.frequency_hz:.1f} Hz: "
                    "the default schedule (n_action_steps frames) is not n_action_steps steps here"
                )

    def frames(self) -> Iterator[tuple[int, str, Callable[[], Observation] | None]]:
        """(t, state, observation) for each of camera 0's frames from the episode's start:
        UNDECODABLE for a frame the robot never gets, NOT_ARRIVED for one whose pose or width
        sample at or after it never arrives, else FED with a function that builds the Observation
        (built only for the frames that are due)."""
        lead_ns = round(self.runner.spec.max_camera_offset_ms * 1e6)
        others = {
            k: _OtherCamera(in_capture_order(camera)) for k, camera in self.streams.cameras.items() if k != 0
        }
        history: deque[tuple[int, np.ndarray]] = deque()
        oldest_offset = int(self.runner.observation_offsets_ns[0])
        for t, rgb in in_capture_order(self.streams.cameras[0]):
            if t < self.start_ns:
                continue
            for other in others.values():
                other.receive_until(t + lead_ns)
            if rgb is None:
                yield t, UNDECODABLE, None
                continue
            history.append((t, rgb))
            # Observation step 0 is wanted at max(t - offset, start); later chunks want later
            # times, so a frame older than the last one at or before that time is never needed.
            oldest = max(t - oldest_offset, self.start_ns)
            while len(history) >= 2 and history[1][0] <= oldest:
                history.popleft()
            # A frame of another camera further than the offset from every frame of camera 0 held
            # is absent to the runner, as to convert: never needed again.
            for other in others.values():
                other.forget_before(history[0][0] - lead_ns)
            if self.samples_end_ns < t:
                yield t, NOT_ARRIVED, None
                continue
            cameras = {0: tuple(history)} | {k: tuple(o.history) for k, o in others.items() if o.history}
            yield t, FED, self._observer(cameras, oldest, t)

    def _observer(
        self, cameras: dict[int, tuple[tuple[int, np.ndarray], ...]], oldest: int, t: int
    ) -> Callable[[], Observation]:
        def observation() -> Observation:
            fields: dict[str, np.ndarray] = {}
            for k, frames in cameras.items():
                ns, rgb = field_names([], [k])
                fields[ns] = np.array([frame_ns for frame_ns, _ in frames], dtype=np.int64)
                fields[rgb] = np.stack([frame for _, frame in frames])
            for i, g in self.grippers.items():
                pose, width = covering(g.pose_ns, oldest, t), covering(g.width_ns, oldest, t)
                values = (
                    g.pose_ns[pose],
                    g.position[pose],
                    g.quaternion[pose],
                    g.width_ns[width],
                    g.width[width],
                )
                fields |= dict(zip(field_names([i], []), values))
            return Observation.checked(**fields)

        return observation


class _OtherCamera:
    """A camera k >= 1's frames as a robot receives them: those captured up to a time, decodable ones
    only (a driver drops the others), the ones still within reach of camera 0's kept."""

    def __init__(self, frames: Iterator[tuple[int, np.ndarray | None]]) -> None:
        self.frames = frames
        self.waiting: tuple[int, np.ndarray | None] | None = None  # read, captured after the last `until`
        self.history: deque[tuple[int, np.ndarray]] = deque()

    def receive_until(self, until_ns: int) -> None:
        while True:
            if self.waiting is None:
                self.waiting = next(self.frames, None)
                if self.waiting is None:
                    return  # the camera's stream ended
            ns, rgb = self.waiting
            if ns > until_ns:
                return
            if rgb is not None:
                self.history.append((ns, rgb))
            self.waiting = None

    def forget_before(self, ns: int) -> None:
        # The last frame before `ns` stays while it is the only one: nearer frames replace it.
        while len(self.history) >= 2 and self.history[1][0] <= ns:
            self.history.popleft()


def capture_order(capture_ns: np.ndarray) -> np.ndarray:
    """Message indices in capture-time order; a repeated capture time is one frame (the first in
    the file), as convert keeps it: a camera driver never delivers two frames of one instant."""
    order = np.argsort(capture_ns, kind="stable")
    keep = np.concatenate([[True], np.diff(capture_ns[order]) > 0])
    return order[keep]


def in_capture_order(camera: CameraStream) -> Iterator[tuple[int, np.ndarray | None]]:
    """(capture time, RGB at the camera's resolution, None if undecodable) of each frame in
    capture-time order, decoded one at a time by convert's decoder loop. A frame decoded before an
    earlier-captured one waits for it (a file a few messages out of order, B-frames): only those
    are held."""
    order = capture_order(camera.ns)
    rank = np.full(len(camera.ns), -1)
    rank[order] = np.arange(len(order))
    waiting: dict[int, np.ndarray | None] = {}
    due = 0
    for index, rgb, _ in each_decoded_frame(camera, None):
        if rank[index] < 0:
            continue  # a repeated capture time
        waiting[int(rank[index])] = rgb
        while due in waiting:
            yield int(camera.ns[order[due]]), waiting.pop(due)
            due += 1


@dataclass(frozen=True)
class _SortedSamples:
    """A gripper's samples in time order, a repeated time kept once (the first in the file): a
    robot's stream arrives in order; the file may hold a few messages swapped."""

    pose_ns: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    width_ns: np.ndarray
    width: np.ndarray

    @classmethod
    def of(cls, gripper: GripperStreams) -> _SortedSamples:
        pose = capture_order(gripper.pose_ns)
        width = capture_order(gripper.width_ns)
        return cls(
            gripper.pose_ns[pose],
            gripper.position[pose],
            gripper.quaternion[pose],
            gripper.width_ns[width],
            gripper.width[width],
        )


# ---------------------------------------------------------------- output


def _monitor_schema() -> bytes:
    number = {"type": ["number", "null"]}
    schema = {
        "title": MONITOR_SCHEMA,
        "description": "The runtime monitor's reading of the chunk computed at timestamp_ns",
        "type": "object",
        "properties": {
            "timestamp_ns": {"type": "integer", "description": "t, the observation's capture time"},
            "novelty": number
            | {"description": "distance of the observation's embedding to the training data"},
            "inconsistency": number | {"description": "departure from the previous chunk (null: the first)"},
            "score": number | {"description": "the persistent combined score over its threshold"},
            "alarm": {"type": "boolean", "description": "score above 1, from the persist-th chunk on"},
        },
        "required": ["timestamp_ns", "novelty", "inconsistency", "score", "alarm"],
    }
    return json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()


def _json_schema() -> bytes:
    schema = {
        "title": WIDTH_SCHEMA,
        "description": "One predicted chunk's gripper openings: step k is the target at time_ns[k]",
        "type": "object",
        "properties": {
            "timestamp_ns": {"type": "integer", "description": "t, the observation's capture time"},
            "seed": {"type": "integer", "description": "the chunk's sampling seed"},
            "time_ns": {"type": "array", "items": {"type": "integer"}},
            "width_m": {"type": "array", "items": {"type": "number"}},
            "executed": {"type": "array", "items": {"type": "boolean"}},
        },
        "required": ["timestamp_ns", "seed", "time_ns", "width_m", "executed"],
    }
    return json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()


def gripper_topic(gripper: int, topic: str) -> str:
    """Gripper i >= 1's predictions under `/robot{i}`, as recording format 2 names its streams."""
    return topic if gripper == 0 else f"/robot{gripper}{topic}"


class PredictionWriter:
    """The predictions MCAP: fixed writer options and registration order, so fixed bytes."""

    def __init__(self, stream: io.BytesIO, grippers: tuple[int, ...] = (0,), monitor: bool = False) -> None:
        self.writer = Writer(
            stream,
            chunk_size=CHUNK_SIZE,
            compression=CompressionType.ZSTD,
            index_types=IndexType.ALL,
            repeat_channels=True,
            repeat_schemas=True,
            use_statistics=True,
            use_summary_offsets=True,
        )
        self.writer.start(profile="", library=LIBRARY)
        poses = self.writer.register_schema(
            PosesInFrame.DESCRIPTOR.full_name,
            "protobuf",
            build_file_descriptor_set(PosesInFrame).SerializeToString(deterministic=True),
        )
        width = self.writer.register_schema(WIDTH_SCHEMA, "jsonschema", _json_schema())
        self.channels: dict[str, int] = {}
        for i in grippers:
            for topic, encoding, schema in (
                (PREDICTED_TOPIC, "protobuf", poses),
                (EXECUTED_TOPIC, "protobuf", poses),
                (WIDTH_TOPIC, "json", width),
            ):
                name = gripper_topic(i, topic)
                self.channels[name] = self.writer.register_channel(name, encoding, schema)
        if monitor:
            schema = self.writer.register_schema(MONITOR_SCHEMA, "jsonschema", _monitor_schema())
            self.channels[MONITOR_TOPIC] = self.writer.register_channel(MONITOR_TOPIC, "json", schema)
        self.sequence = 0

    def metadata(self, data: dict[str, str]) -> None:
        self.writer.add_metadata(METADATA_NAME, data)

    def chunk(self, chunk: ActionChunk, seed: int) -> None:
        t = chunk.observation_ns
        executed = np.flatnonzero(chunk.execute)
        for i, targets in chunk.grippers.items():
            width = {
                "timestamp_ns": t,
                "seed": seed,
                "time_ns": chunk.time_ns.tolist(),
                "width_m": targets.width.tolist(),
                "executed": chunk.execute.tolist(),
            }
            for topic, data in (
                (PREDICTED_TOPIC, poses_message(t, targets, np.arange(len(chunk.time_ns)))),
                (EXECUTED_TOPIC, poses_message(t, targets, executed)),
                (WIDTH_TOPIC, json.dumps(width, separators=(",", ":")).encode()),
            ):
                self.writer.add_message(
                    channel_id=self.channels[gripper_topic(i, topic)],
                    log_time=t,
                    publish_time=t,
                    data=data,
                    sequence=self.sequence,
                )
        if chunk.monitor is not None:
            reading = {"timestamp_ns": t} | chunk.monitor.fields()
            self.writer.add_message(
                channel_id=self.channels[MONITOR_TOPIC],
                log_time=t,
                publish_time=t,
                data=json.dumps(reading, separators=(",", ":")).encode(),
                sequence=self.sequence,
            )
        self.sequence += 1  # the chunk's number, the same on all its messages

    def finish(self) -> None:
        self.writer.finish()


def poses_message(observation_ns: int, targets: GripperTargets, steps: np.ndarray) -> bytes:
    msg = PosesInFrame()
    msg.timestamp.FromNanoseconds(int(observation_ns))
    msg.frame_id = FRAME_ID
    for k in steps:
        pose = msg.poses.add()
        pose.position.x, pose.position.y, pose.position.z = (float(v) for v in targets.position[k])
        o = pose.orientation
        o.x, o.y, o.z, o.w = (float(v) for v in targets.quaternion[k])
    return msg.SerializeToString(deterministic=True)
