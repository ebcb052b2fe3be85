"""A rig of several grippers and a fixed scene camera, as recording format 2 writes it
(shared/recording-format.md, "Version 2"): the bimanual sample.

Each gripper does the sample's pick-and-place on a block of its own, side by side on one table:
gripper i works `WORKSPACE_SPACING_M` * i along world +y from gripper 0, whose plan is exactly the
single-gripper sample's. Each wrist camera sees the table with every block and place mark (the
other gripper itself is not drawn in a wrist view); the scene camera looks down at the table from
behind the grippers and sees blocks and grippers alike. Every stream has its own clock: each
gripper's camera, pose and width as a single-gripper recording's (`recording.random_timing`), the
scene camera at `SCENE_CAMERA_HZ` with its own jitter, drops and start. The topics are version 2's:
`/robot{i}/vio/pose`, `/robot{i}/gripper/width`, `/camera{i}/image` for gripper i's wrist camera,
and `/camera{N}/image` for the scene camera of an N-gripper rig.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from policypipe.synthetic.motion import MotionPlan, plan_motion
from policypipe.synthetic.recording import (
    StreamTiming,
    _camera_message,
    _encode_image,
    _H264Encoder,
    _json_message,
    _log_times,
    _Message,
    _pose_message,
    _swap_some,
    camera_clock,
    sample_clock,
)
from policypipe.synthetic.render import (
    draw_timecode,
    render_fixed_view_bgr,
    render_view_bgr,
    table_texture,
    timecode_value,
)

WORKSPACE_SPACING_M = 0.45  # gripper i's workspace lies this much further along world +y per i
SCENE_CAMERA_HZ = 20.0
SCENE_CAMERA_JITTER_S = 0.002
# Behind gripper 0's side of the table (world -x), above it, looking at the table's centre.
SCENE_CAMERA_FROM_TABLE_CENTRE_M = np.array([-0.55, 0.0, 0.85])
RAW_H264_PRESET = "ultrafast"


@dataclass(frozen=True, eq=False)
class RigPlan:
    """One recording of the rig: a plan per gripper, all on one table."""

    plans: tuple[MotionPlan, ...]

    @property
    def start_ns(self) -> int:
        return min(p.start_ns for p in self.plans)

    @property
    def end_ns(self) -> int:
        return max(p.end_ns for p in self.plans)

    @property
    def table(self):
        """The shared table (its centre, colour and texture are every plan's)."""
        return self.plans[0].scene

    def scene_camera(self) -> tuple[np.ndarray, np.ndarray]:
        """The fixed scene camera: rotation (3, 3), columns its axes (x right, y down, z optical
        axis) in the world, and its centre (3,)."""
        centre_xy = self.table.table_center
        centre = np.array([*centre_xy, 0.0]) + SCENE_CAMERA_FROM_TABLE_CENTRE_M
        forward = np.array([*centre_xy, 0.0]) - centre
        z = forward / np.linalg.norm(forward)
        x = np.cross(z, [0.0, 0.0, 1.0])
        x /= np.linalg.norm(x)
        return np.column_stack([x, np.cross(z, x), z]), centre

    def blocks_at(self, t_ns: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, tuple[float, float, float]]]:
        """Per gripper: its block's centres (N, 3), yaws (N,) and size at times `t_ns` (N,)."""
        return [(*p.target_at(t_ns), p.scene.target_size) for p in self.plans]


def plan_rig(
    rng: np.random.Generator, start_ns: int, grippers: int, duration_s: float | None = None
) -> RigPlan:
    """`grippers` pick-and-place plans drawn one after the other from `rng` (gripper 0's is the
    single-gripper sample's plan for the same draws), moved side by side onto one table;
    `duration_s` as `plan_motion`'s."""
    if not 1 <= grippers <= 4:
        raise ValueError(f"grippers={grippers}: a rig has 1 to 4 grippers")
    plans = [plan_motion(rng, start_ns, duration_s) for _ in range(grippers)]
    shifted = [_moved(p, np.array([0.0, WORKSPACE_SPACING_M * i])) for i, p in enumerate(plans)]
    centre = np.mean([p.scene.table_center for p in shifted], axis=0)
    table = {
        "table_center": centre,
        "table_bgr": plans[0].scene.table_bgr,
        "texture_seed": plans[0].scene.texture_seed,
    }
    return RigPlan(tuple(replace(p, scene=replace(p.scene, **table)) for p in shifted))


def _moved(plan: MotionPlan, offset_xy: np.ndarray) -> MotionPlan:
    """The same plan with everything in it moved by `offset_xy` on the table."""
    offset = np.array([*offset_xy, 0.0])
    scene = plan.scene
    return replace(
        plan,
        knot_position=plan.knot_position + offset,
        scene=replace(
            scene,
            target_xy=scene.target_xy + offset_xy,
            place_xy=scene.place_xy + offset_xy,
            table_center=scene.table_center + offset_xy,
        ),
    )


@dataclass(frozen=True, eq=False)
class RigTruth:
    """What a rig recording contains: capture times (int64 ns) per camera and per gripper stream."""

    camera_ns: dict[int, np.ndarray]  # camera k -> its frames' capture times; absent cameras missing
    dropped_frames: dict[int, int]
    pose_ns: dict[int, np.ndarray]  # gripper i -> its pose samples' times
    width_ns: dict[int, np.ndarray]

    @property
    def frames(self) -> int:
        """Camera 0's frames: what the status file counts."""
        return len(self.camera_ns[0])

    @property
    def last_frame_ns(self) -> int:
        return int(self.camera_ns[0][-1])


@dataclass(frozen=True, eq=False)
class RigRecording:
    """One rig recording, sampled and encoded (`recording.write_simulated_vio` / `_raw` write it)."""

    rig: RigPlan
    truth: RigTruth
    vio_messages: tuple[_Message, ...]
    raw_messages: tuple[_Message, ...]


def simulate_rig_recording(
    rig: RigPlan,
    timings: tuple[StreamTiming, ...],
    scene_timing: StreamTiming | None,
    rng: np.random.Generator,
    *,
    image_size: tuple[int, int] = (320, 240),
    timecode: bool = False,
    absent_cameras: frozenset[int] = frozenset(),
) -> RigRecording:
    """Samples every gripper's streams on its own `timings[i]` clocks and the scene camera (camera
    N, when `scene_timing` is given) on its own, renders and encodes every frame (JPEG images), and
    builds the version 2 messages with their log times. `absent_cameras` are cameras that recorded
    nothing (a camera unplugged for a take); `timecode` draws each frame's capture time into it."""
    n = len(rig.plans)
    if len(timings) != n:
        raise ValueError(f"{len(timings)} timings for {n} grippers: give one per gripper")
    if 0 in absent_cameras:
        raise ValueError("camera 0 is the dataset's clock: a recording without it converts to nothing")
    texture = table_texture(rig.table, tuple((p.scene.place_xy, p.scene.place_yaw) for p in rig.plans))
    streams: list[tuple[str, np.ndarray, list[bytes]]] = []
    camera_ns: dict[int, np.ndarray] = {}
    dropped: dict[int, int] = {}
    pose_ns: dict[int, np.ndarray] = {}
    width_ns: dict[int, np.ndarray] = {}

    def span(plan_start: int, plan_end: int, start_s: float, stop_s: float) -> tuple[int, int]:
        return plan_start + int(round(start_s * 1e9)), plan_end - int(round(stop_s * 1e9))

    def camera_times(start_ns: int, end_ns: int, timing: StreamTiming) -> tuple[np.ndarray, int]:
        where = span(start_ns, end_ns, timing.camera_start_s, timing.camera_stop_s)
        return camera_clock(rng, where, timing.camera_hz, timing.camera_jitter_s, timing.camera_drop_fraction)

    for i, (plan, timing) in enumerate(zip(rig.plans, timings)):
        ns, dropped[i] = camera_times(plan.start_ns, plan.end_ns, timing)
        pose_ns[i] = sample_clock(
            rng,
            *span(plan.start_ns, plan.end_ns, timing.pose_start_s, timing.pose_stop_s),
            timing.pose_hz,
            timing.pose_jitter_s,
        )
        width_ns[i] = sample_clock(
            rng,
            *span(plan.start_ns, plan.end_ns, timing.width_start_s, timing.width_stop_s),
            timing.width_hz,
            timing.width_jitter_s,
        )
        frames = _wrist_frames(rig, i, ns, texture, image_size, timecode)
        if i == 0:
            wrist0 = frames
        if i not in absent_cameras:
            camera_ns[i] = ns
            streams.append(_camera_stream(i, ns, frames))
        position, quat = plan.pose_at(pose_ns[i])
        streams.append(
            (
                f"/robot{i}/vio/pose",
                pose_ns[i],
                [_pose_message(t, p, q) for t, p, q in zip(pose_ns[i], position, quat)],
            )
        )
        widths = plan.width_at(width_ns[i])
        streams.append(
            (
                f"/robot{i}/gripper/width",
                width_ns[i],
                [
                    _json_message({"stamp_ns": int(t), "width_m": float(w)})
                    for t, w in zip(width_ns[i], widths)
                ],
            )
        )
    if scene_timing is not None:
        ns, dropped[n] = camera_times(rig.start_ns, rig.end_ns, scene_timing)
        if n not in absent_cameras:
            camera_ns[n] = ns
            streams.append(_camera_stream(n, ns, _scene_frames(rig, ns, texture, image_size, timecode)))

    vio: list[tuple[int, int, int, _Message]] = []
    for rank, (topic, capture, datas) in enumerate(streams):
        for j, (log_ns, data) in enumerate(zip(_log_times(rng, capture, timings[0]), datas)):
            vio.append((int(log_ns), rank, j, _Message(topic, int(log_ns), data)))
    vio.sort(key=lambda m: m[:3])
    vio_messages = _swap_some([m[3] for m in vio], rng, timings[0].out_of_order_fraction)

    # The raw recording: gripper 0's device stream, H.264 as the device logged it (1 ms later).
    encoder = _H264Encoder(image_size, timings[0].camera_hz, RAW_H264_PRESET)
    raw = []
    for t, bgr in zip(camera_ns[0], wrist0):
        message = _camera_message("video", int(t), encoder.encode(bgr), "h264")
        raw.append(_Message("video", int(t) + 1_000_000, message))
    encoder.close()
    truth = RigTruth(camera_ns=camera_ns, dropped_frames=dropped, pose_ns=pose_ns, width_ns=width_ns)
    return RigRecording(rig=rig, truth=truth, vio_messages=tuple(vio_messages), raw_messages=tuple(raw))


def _camera_stream(k: int, ns: np.ndarray, frames: list[np.ndarray]) -> tuple[str, np.ndarray, list[bytes]]:
    messages = [
        _camera_message("image", int(t), _encode_image(bgr, "jpeg"), "jpeg", frame_id=f"camera{k}")
        for t, bgr in zip(ns, frames)
    ]
    return f"/camera{k}/image", ns, messages


def _wrist_frames(
    rig: RigPlan, i: int, ns: np.ndarray, texture: np.ndarray, image_size: tuple[int, int], timecode: bool
) -> list[np.ndarray]:
    """Gripper i's wrist camera at times `ns`: its own block, and every other gripper's."""
    plan = rig.plans[i]
    position, quat = plan.pose_at(ns)
    grip = plan.width_at(ns)
    blocks = rig.blocks_at(ns)
    frames = []
    for j in range(len(ns)):
        others = tuple((b[0][j], float(b[1][j]), b[2]) for g, b in enumerate(blocks) if g != i)
        own = blocks[i]
        image = render_view_bgr(
            plan.scene,
            texture,
            position[j],
            quat[j],
            own[0][j],
            float(own[1][j]),
            float(grip[j]),
            image_size,
            others,
        )
        if timecode:
            draw_timecode(image, timecode_value(int(ns[j])))
        frames.append(image)
    return frames


def _scene_frames(
    rig: RigPlan, ns: np.ndarray, texture: np.ndarray, image_size: tuple[int, int], timecode: bool
) -> list[np.ndarray]:
    """The fixed scene camera at times `ns`: the table, every block and every gripper."""
    r_cam, centre = rig.scene_camera()
    blocks = rig.blocks_at(ns)
    poses = [(*p.pose_at(ns), p.width_at(ns)) for p in rig.plans]
    frames = []
    for j in range(len(ns)):
        image = render_fixed_view_bgr(
            rig.table,
            texture,
            r_cam,
            centre,
            [(b[0][j], float(b[1][j]), b[2]) for b in blocks],
            [(pos[j], quat[j], float(width[j])) for pos, quat, width in poses],
            image_size,
        )
        if timecode:
            draw_timecode(image, timecode_value(int(ns[j])))
        frames.append(image)
    return frames
