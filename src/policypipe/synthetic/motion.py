"""The demonstrator's motion in the synthetic scene: a pick-and-place as continuous ground truth.

`MotionPlan.pose_at` and `MotionPlan.width_at` take any int64 nanosecond timestamps, so a test can
evaluate the truth at whatever camera timestamps a recording ended up with. Positions and widths
are quantised to 0.1 um and quaternion components to 1e-9: far below anything measurable, but it
keeps last-bit differences between math libraries of different machines out of the written bytes.
Frames: see `scene`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.synthetic.scene import GRIP_SQUEEZE_M, TABLE_PALETTE_BGR, WIDTH_OPEN_M, Scene


@dataclass(frozen=True, eq=False)
class MotionPlan:
    """One recording's continuous ground truth: the demonstrator's TCP pose, the gripper
    width and the target block, as functions of absolute capture time (Unix ns).

    The motion is piecewise minimum-jerk between knots (hand movements start and stop
    smoothly) plus a small smooth wobble (a hand is never still). Before the first and
    after the last knot the hand holds still (plus wobble).
    """

    start_ns: int
    end_ns: int
    knot_s: np.ndarray  # (K,) seconds since start_ns, strictly increasing
    knot_position: np.ndarray  # (K, 3) TCP position, m
    knot_yaw: np.ndarray  # (K,) rad, about world z
    knot_width: np.ndarray  # (K,) m
    tilt_rad: tuple[float, float]  # constant (roll, pitch) of the hand about tool x and y
    wobble_hz: np.ndarray  # (M, 6) frequencies per component: x, y, z, roll, pitch, yaw
    wobble_phase: np.ndarray  # (M, 6)
    wobble_amp: np.ndarray  # (M, 6) m for x y z, rad for the angles
    attach_s: float  # the block is held from here (fingers closed on it) ...
    release_s: float  # ... to here (fingers start to open)
    scene: Scene
    # Where the held block's centre sits in the tool frame; None: at the TCP (the plain plans). A
    # takeover (`plan_takeover`) holds the block where the simulator's fingers closed on it.
    grip_offset_tool: np.ndarray | None = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def events_ns(self) -> dict[str, int]:
        """Moments a test may want to look at: grasp (block held) and release."""
        return {
            "grasp": self.start_ns + int(round(self.attach_s * 1e9)),
            "release": self.start_ns + int(round(self.release_s * 1e9)),
        }

    def _seconds(self, t_ns: np.ndarray) -> np.ndarray:
        # Subtract in integers first: float64 cannot hold absolute Unix ns exactly.
        return (np.asarray(t_ns, dtype=np.int64) - np.int64(self.start_ns)).astype(np.float64) / 1e9

    def _wobble(self, t_s: np.ndarray) -> np.ndarray:
        """(N, 6) smooth hand tremor: a few slow sinusoids per component."""
        angle = 2.0 * np.pi * self.wobble_hz[None] * t_s[:, None, None] + self.wobble_phase[None]
        return (self.wobble_amp[None] * np.sin(angle)).sum(axis=1)

    def _tool_rotation(self, t_s: np.ndarray) -> Rotation:
        wobble = self._wobble(t_s)
        yaw = _min_jerk(self.knot_s, self.knot_yaw[:, None], t_s)[:, 0] + wobble[:, 5]
        roll = self.tilt_rad[0] + wobble[:, 3]
        pitch = self.tilt_rad[1] + wobble[:, 4]
        # Yaw about world z, then point the tool down (half turn about x), then the hand's
        # small tilts about its own axes.
        return (
            Rotation.from_euler("z", yaw[:, None])
            * Rotation.from_rotvec([math.pi, 0.0, 0.0])
            * Rotation.from_euler("x", roll[:, None])
            * Rotation.from_euler("y", pitch[:, None])
        )

    def _heading(self, t_s: np.ndarray) -> np.ndarray:
        """(N,) direction of the tool's x axis on the table, rad."""
        x_axis = self._tool_rotation(t_s).as_matrix()[:, :, 0]
        return np.arctan2(x_axis[:, 1], x_axis[:, 0])

    def pose_at(self, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TCP pose at capture times `t_ns` (N,) int64: positions (N, 3) m and unit
        quaternions (N, 4) xyzw, in the world frame. The quaternion sign is chosen on the
        hemisphere of the start orientation, so consecutive samples never flip sign."""
        t_s = self._seconds(np.atleast_1d(t_ns))
        position = _min_jerk(self.knot_s, self.knot_position, t_s) + self._wobble(t_s)[:, :3]
        quat = self._tool_rotation(t_s).as_quat()
        reference = (
            Rotation.from_euler("z", self.knot_yaw[0]) * Rotation.from_rotvec([math.pi, 0, 0])
        ).as_quat()
        quat = np.where((quat @ reference)[:, None] < 0.0, -quat, quat)
        return np.round(position, 7), np.round(quat, 9)

    def width_at(self, t_ns: np.ndarray) -> np.ndarray:
        """Gripper opening (N,) m at capture times `t_ns` (N,) int64."""
        t_s = self._seconds(np.atleast_1d(t_ns))
        return np.round(_min_jerk(self.knot_s, self.knot_width[:, None], t_s)[:, 0], 7)

    def target_at(self, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Centre (N, 3) m and yaw (N,) rad of the target block: on the table until the
        fingers close on it, then carried by the TCP, then left where it was released."""
        t_s = self._seconds(np.atleast_1d(t_ns))
        size = self.scene.target_size
        on_table = np.array([*self.scene.target_xy, size[2] / 2.0])
        centre = np.tile(on_table, (len(t_s), 1))
        yaw = np.full(len(t_s), self.scene.target_yaw)
        held = (t_s >= self.attach_s) & (t_s < self.release_s)
        released = t_s >= self.release_s
        key_s = np.array([self.attach_s, self.release_s])
        key_pos = _min_jerk(self.knot_s, self.knot_position, key_s) + self._wobble(key_s)[:, :3]
        key_yaw = self._heading(key_s)
        # The block keeps the yaw it had relative to the fingers when they closed on it.
        yaw_in_hand = self.scene.target_yaw - key_yaw[0]
        if self.grip_offset_tool is not None:
            offset = lambda ts: self._tool_rotation(ts).apply(self.grip_offset_tool)  # noqa: E731
            key_pos = key_pos + offset(key_s)
        if held.any():
            ts = t_s[held]
            centre[held] = _min_jerk(self.knot_s, self.knot_position, ts) + self._wobble(ts)[:, :3]
            if self.grip_offset_tool is not None:
                centre[held] += offset(ts)
            yaw[held] = self._heading(ts) + yaw_in_hand
        if released.any():
            centre[released] = [key_pos[1, 0], key_pos[1, 1], size[2] / 2.0]
            yaw[released] = key_yaw[1] + yaw_in_hand
        return centre, yaw


def _min_jerk(knot_s: np.ndarray, values: np.ndarray, t_s: np.ndarray) -> np.ndarray:
    """Piecewise minimum-jerk interpolation of `values` (K, D) at `t_s` (N,) -> (N, D):
    zero velocity and acceleration at every knot, constant outside the knots."""
    k = len(knot_s)
    i = np.clip(np.searchsorted(knot_s, t_s, side="right") - 1, 0, k - 2)
    tau = np.clip((t_s - knot_s[i]) / (knot_s[i + 1] - knot_s[i]), 0.0, 1.0)
    s = tau**3 * (10.0 - 15.0 * tau + 6.0 * tau**2)
    return values[i] + (values[i + 1] - values[i]) * s[:, None]


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def plan_motion(
    rng: np.random.Generator,
    start_ns: int,
    duration_s: float | None = None,
    recovery_rng: np.random.Generator | None = None,
    hand_rng: np.random.Generator | None = None,
) -> MotionPlan:
    """A pick-and-place demonstration with a random scene: start behind the block, approach
    above it while turning the fingers across it, descend, close, lift, carry to the place
    marker, lower, open, retreat. Episodes last 7-11 s; `duration_s` rescales the phases to
    an exact length (>= 2 s).

    With `recovery_rng`, the demonstrator strays and corrects (a recovery demonstration): the
    approach ends off target, the descent stops short and beside the block, the carry ends beside
    the mark, and each time the hand moves back to where the plain demonstration goes (the
    offsets: `_strayed`).

    With `hand_rng`, a person's hand (`PersonsHand`): it grasps the block off its centre along the
    fingers, carries it so that the block's centre (not the TCP) comes over the mark, and the held
    block's frames show it where it was grasped; and it may arrive above the block turned and off,
    then correct before descending. The scene, and every draw from `rng`, are those of the plain
    plan."""
    if duration_s is not None and not (2.0 <= duration_s <= 600.0):
        raise ValueError(f"duration_s={duration_s}: use a duration between 2 and 600 seconds")

    heading = float(rng.uniform(-math.pi, math.pi))  # direction the demonstrator works in
    forward = np.array([math.cos(heading), math.sin(heading)])
    left = np.array([-forward[1], forward[0]])

    narrow = float(rng.uniform(0.022, 0.030))
    size = (narrow, float(rng.uniform(0.05, 0.07)), float(rng.uniform(0.035, 0.05)))
    target_xy = np.array([0.45, 0.0]) + rng.uniform(-0.08, 0.08, size=2)
    target_yaw = float(rng.uniform(-math.pi, math.pi))
    place_dir = heading + float(rng.uniform(-1.0, 1.0))
    place_xy = target_xy + float(rng.uniform(0.15, 0.24)) * np.array(
        [math.cos(place_dir), math.sin(place_dir)]
    )

    start_yaw = heading + float(rng.uniform(-0.15, 0.15))
    # The fingers close across the narrow side, so the tool's x axis lies along the block's
    # long side; of the two ways to do that, the hand takes the one closer to where it points.
    grasp_yaw = _equivalent_yaw(start_yaw, target_yaw)
    place_yaw = grasp_yaw + float(rng.uniform(-0.5, 0.5))

    hand = PersonsHand.draw(hand_rng) if hand_rng is not None else None
    # Grasped `along_m` from the block's centre along the fingers (tool x), the TCP is that far from
    # the block's centre at the grasp, and again at the place to bring the block's centre over the mark.
    along_m = hand.along_m if hand is not None else 0.0
    grasp_along = along_m * np.array([math.cos(grasp_yaw), math.sin(grasp_yaw)])
    place_along = along_m * np.array([math.cos(place_yaw), math.sin(place_yaw)])

    start = np.array(
        [
            *(target_xy - rng.uniform(0.12, 0.22) * forward + rng.uniform(-0.06, 0.06) * left),
            rng.uniform(0.20, 0.28),
        ]
    )
    grasp_z = size[2] / 2.0
    above = np.array(
        [*(target_xy + rng.normal(0.0, 0.003, 2) + grasp_along), size[2] + rng.uniform(0.08, 0.12)]
    )
    grasp = np.array([above[0], above[1], grasp_z + 0.003])
    lifted = np.array([grasp[0], grasp[1], rng.uniform(0.12, 0.16)])
    over_place = np.array(
        [*(place_xy + rng.normal(0.0, 0.004, 2) + place_along), lifted[2] + rng.uniform(-0.02, 0.02)]
    )
    placed = np.array([over_place[0], over_place[1], grasp_z + 0.005])
    retreat = placed + np.array([*(-rng.uniform(0.0, 0.05) * forward), rng.uniform(0.08, 0.12)])

    width_open = float(rng.uniform(0.078, WIDTH_OPEN_M))
    # The finger pads are compliant: closed on the block they read its width less GRIP_SQUEEZE_M
    # (each pad gives 2 mm under the grip force), and the block stays held while the commanded
    # opening is below its width (the simulator's rule).
    width_closed = narrow - GRIP_SQUEEZE_M

    # (phase duration s, position, yaw, width) reached at the end of each phase
    phases = [
        (rng.uniform(0.4, 0.7), start, start_yaw, width_open),  # hold still
        (rng.uniform(1.4, 2.2), above, grasp_yaw, width_open),  # approach
        (rng.uniform(0.8, 1.2), grasp, grasp_yaw, width_open),  # descend
        (rng.uniform(0.4, 0.6), grasp, grasp_yaw, width_closed),  # close
        (rng.uniform(0.15, 0.25), grasp, grasp_yaw, width_closed),  # settle
        (rng.uniform(0.7, 1.0), lifted, grasp_yaw, width_closed),  # lift
        (rng.uniform(1.2, 1.8), over_place, place_yaw, width_closed),  # carry
        (rng.uniform(0.6, 0.9), placed, place_yaw, width_closed),  # lower
        (rng.uniform(0.3, 0.5), placed, place_yaw, width_open),  # open
        (rng.uniform(0.6, 0.9), retreat, place_yaw, width_open),  # retreat
        (rng.uniform(0.3, 0.6), retreat, place_yaw, width_open),  # hold still
    ]
    # The block is held from the end of "close" to the start of "open" (knot i ends phase i - 1).
    attach_knot, release_knot = 4, 8
    if recovery_rng is not None:
        phases, attach_knot, release_knot = _strayed(recovery_rng, phases)
    elif hand is not None and hand.arrives_astray:
        # The approach ends turned and off above the block; the hand corrects, then descends.
        duration, above_block, yaw, width = phases[1]
        arrival = np.array([*(above_block[:2] + hand.arrival_off_m), above_block[2]])
        phases[1:2] = [
            (duration, arrival, yaw + hand.arrival_turn_rad, width),
            (hand.correct_s, above_block, yaw, width),
        ]
        attach_knot, release_knot = attach_knot + 1, release_knot + 1
    durations = np.array([p[0] for p in phases])
    if duration_s is not None:
        durations *= duration_s / durations.sum()
    knot_s = np.concatenate([[0.0], np.cumsum(durations)])
    knot_position = np.array([start] + [p[1] for p in phases])
    knot_yaw = np.array([start_yaw] + [p[2] for p in phases])
    knot_width = np.array([width_open] + [p[3] for p in phases])

    wobble_hz, wobble_phase, wobble_amp = _draw_wobble(rng)

    scene = Scene(
        target_xy=target_xy,
        target_yaw=target_yaw,
        target_size=size,
        place_xy=place_xy,
        place_yaw=place_yaw,
        table_center=(target_xy + place_xy) / 2.0,
        table_bgr=TABLE_PALETTE_BGR[int(rng.integers(len(TABLE_PALETTE_BGR)))],
        texture_seed=int(rng.integers(2**31)),
    )
    plan = MotionPlan(
        start_ns=int(start_ns),
        end_ns=int(start_ns) + int(round(float(knot_s[-1]) * 1e9)),
        knot_s=knot_s,
        knot_position=knot_position,
        knot_yaw=knot_yaw,
        knot_width=knot_width,
        tilt_rad=(float(np.radians(rng.uniform(-5, 5))), float(np.radians(rng.uniform(-5, 5)))),
        wobble_hz=wobble_hz,
        wobble_phase=wobble_phase,
        wobble_amp=wobble_amp,
        attach_s=float(knot_s[attach_knot]),
        release_s=float(knot_s[release_knot]),
        scene=scene,
    )
    if hand is None:
        return plan  # the plain plans hold the block at the TCP, as before
    return replace(plan, grip_offset_tool=_grip_offset(plan))


@dataclass(frozen=True)
class PersonsHand:
    """How a person's hand departs from the plain demonstrator, drawn per recording (`draw`)."""

    along_m: float  # the grasp's distance from the block's centre along the fingers (tool x)
    arrives_astray: bool  # whether the approach ends turned and off above the block, then corrects
    arrival_turn_rad: float  # how far the fingers are turned from the grasp yaw on arrival
    arrival_off_m: np.ndarray  # (2,) where the hand arrives beside the spot above the block
    correct_s: float  # how long the correction takes

    # A person centres a grasp by eye: within 12 mm of the block's centre along its 50-70 mm long side
    # (the finger plates span 16 mm, so the block still fills them). Half the recordings arrive astray,
    # a third of those turned only, a third off only, a third both: turned 10-40 degrees either way,
    # off 1-2 cm in any direction.
    ALONG_MAX_M = 0.012
    ASTRAY_FRACTION = 0.5
    TURN_DEG = (10.0, 40.0)
    OFF_M = (0.01, 0.02)
    CORRECT_S = (0.5, 0.9)

    @classmethod
    def draw(cls, rng: np.random.Generator) -> PersonsHand:
        along_m = float(rng.uniform(-cls.ALONG_MAX_M, cls.ALONG_MAX_M))
        arrives_astray = bool(rng.random() < cls.ASTRAY_FRACTION)
        kind = int(rng.integers(3))  # 0: turned, 1: off, 2: both
        turn = float(np.radians(rng.uniform(*cls.TURN_DEG))) * float(rng.choice([-1.0, 1.0]))
        direction = float(rng.uniform(-math.pi, math.pi))
        off = float(rng.uniform(*cls.OFF_M)) * np.array([math.cos(direction), math.sin(direction)])
        return cls(
            along_m=along_m,
            arrives_astray=arrives_astray,
            arrival_turn_rad=turn if kind != 1 else 0.0,
            arrival_off_m=off if kind != 0 else np.zeros(2),
            correct_s=float(rng.uniform(*cls.CORRECT_S)),
        )


def _grip_offset(plan: MotionPlan) -> np.ndarray:
    """Where the block's centre sits in the tool frame once the fingers closed on it: where it lay on
    the table, seen from the TCP at the close, pushed to the middle between the fingers (tool y 0), as
    the simulator's closing fingers push it."""
    t_attach = np.array([plan.start_ns + int(round(plan.attach_s * 1e9))], dtype=np.int64)
    position, quaternion = plan.pose_at(t_attach)
    size = plan.scene.target_size
    on_table = np.array([*plan.scene.target_xy, size[2] / 2.0])
    offset = Rotation.from_quat(quaternion[0]).inv().apply(on_table - position[0])
    offset[1] = 0.0
    return np.round(offset, 7)


def _draw_wobble(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A hand's tremor: frequencies, phases and amplitudes of a few slow sinusoids per component."""
    m = 3
    wobble_hz = rng.uniform(0.2, 1.3, size=(m, 6))
    wobble_phase = rng.uniform(0.0, 2.0 * np.pi, size=(m, 6))
    # ~2 mm of positional tremor, ~0.6 deg of angular tremor per component.
    wobble_amp = np.concatenate(
        [rng.uniform(0.0005, 0.0012, size=(m, 3)), np.radians(rng.uniform(0.1, 0.35, size=(m, 3)))], axis=1
    )
    return wobble_hz, wobble_phase, wobble_amp


def _equivalent_yaw(current: float, wanted: float) -> float:
    """The yaw nearest `current` that lines the fingers up with `wanted` (either way round: a block
    and a mark look the same turned by half a turn)."""
    return current + _wrap(2.0 * (wanted - current)) / 2.0


class GripperAndBlock(Protocol):
    """The state a takeover starts from (`simulator.SimState` is one; world frame, metres)."""

    position: np.ndarray  # (3,) TCP
    quaternion: np.ndarray  # (4,) xyzw, world <- tool
    width: float  # finger opening
    block_centre: np.ndarray  # (3,)
    block_yaw: float
    held: bool


def plan_takeover(
    rng: np.random.Generator, start_ns: int, scene: Scene, state: GripperAndBlock
) -> MotionPlan:
    """The demonstrator taking over at a state of the scene that its plans need not visit (where a
    policy drove the gripper: a correction recording, DAgger's label): from the simulator's `state`
    (the TCP pose, the opening, the block and whether it is held), the rest of the task as
    `plan_motion` does it, starting at `start_ns`.

    With the block on the table: open if closed, approach above the block where it lies now, turn the
    fingers across it, descend, close, lift, carry, lower onto the mark, open, retreat. Held (the
    fingers closed on it, `held`): lift if low, then carry it, the block's centre (not the TCP) over
    the mark, lower, open, retreat. The plan starts exactly at the given pose (its tremor starts from
    there) and keeps the hand's tilt; the returned plan's scene is `scene` with the block where it is.
    """
    position, width, block_centre, block_yaw = (
        state.position,
        state.width,
        state.block_centre,
        state.block_yaw,
    )
    held = state.held
    rotation = Rotation.from_quat(state.quaternion)
    yaw, flipped_roll, pitch = rotation.as_euler("ZXY")  # the plan's yaw, then x by pi + roll, then y
    roll = _wrap(flipped_roll - math.pi)
    wobble_hz, wobble_phase, wobble_amp = _draw_wobble(rng)
    tremor = (wobble_amp * np.sin(wobble_phase)).sum(axis=0)  # at t = 0: taken off the start knot
    yaw0 = float(yaw - tremor[5])
    start = position - tremor[:3]
    narrow, _, height = scene.target_size
    width_open = float(rng.uniform(0.078, WIDTH_OPEN_M))
    lifted_z = float(rng.uniform(0.12, 0.16))
    place_yaw = _equivalent_yaw(yaw0, scene.place_yaw)
    duration = lambda low, high: float(rng.uniform(low, high))  # noqa: E731
    phases: list[tuple[float, np.ndarray, float, float]] = []

    if held:
        grip = rotation.inv().apply(np.asarray(block_centre) - position)  # the block in the tool frame
        width_closed = float(width)
        if position[2] < lifted_z - 0.01:
            phases.append((duration(0.7, 1.0), np.array([*start[:2], lifted_z]), yaw0, width_closed))
        # The block's centre over the mark: the TCP beside it by the grip offset at the place yaw.
        place_rotation = Rotation.from_euler("z", place_yaw) * Rotation.from_rotvec([math.pi, 0, 0])
        offset = (place_rotation * Rotation.from_euler("xy", [roll, pitch])).apply(grip)
        attach_knot = 0
    else:
        grip = None
        width_closed = narrow - GRIP_SQUEEZE_M
        extent_yaw = _equivalent_yaw(yaw0, block_yaw)
        if width < width_open - 0.005:  # closed (on nothing) or half open: open where it is first
            phases.append((duration(0.3, 0.5), start, yaw0, width_open))
        above = np.array(
            [*(np.asarray(block_centre)[:2] + rng.normal(0.0, 0.003, 2)), height + duration(0.08, 0.12)]
        )
        grasp = np.array([above[0], above[1], height / 2.0 + 0.003])
        phases += [
            (duration(1.4, 2.2), above, extent_yaw, width_open),  # approach
            (duration(0.8, 1.2), grasp, extent_yaw, width_open),  # descend
            (duration(0.4, 0.6), grasp, extent_yaw, width_closed),  # close
            (duration(0.15, 0.25), grasp, extent_yaw, width_closed),  # settle
            (duration(0.7, 1.0), np.array([*grasp[:2], lifted_z]), extent_yaw, width_closed),  # lift
        ]
        offset = np.zeros(3)
        attach_knot = len(phases) - 1  # held from the end of "close"
    over_place = np.array([*(scene.place_xy - offset[:2] + rng.normal(0.0, 0.004, 2)), lifted_z])
    # Lowered until the block's bottom is 5 mm above the table (as the plain plans' placement).
    placed = np.array([over_place[0], over_place[1], height / 2.0 + 0.005 - offset[2]])
    forward = np.array([math.cos(place_yaw), math.sin(place_yaw)])
    retreat = placed + np.array([*(-duration(0.0, 0.05) * forward), duration(0.08, 0.12)])
    phases += [
        (duration(1.2, 1.8), over_place, place_yaw, width_closed),  # carry
        (duration(0.6, 0.9), placed, place_yaw, width_closed),  # lower
    ]
    release_knot = len(phases)  # released from the start of "open"
    phases += [
        (duration(0.3, 0.5), placed, place_yaw, width_open),  # open
        (duration(0.6, 0.9), retreat, place_yaw, width_open),  # retreat
        (duration(0.3, 0.6), retreat, place_yaw, width_open),  # hold still
    ]
    knot_s = np.concatenate([[0.0], np.cumsum([p[0] for p in phases])])
    taken_over = replace(
        scene, target_xy=np.asarray(block_centre, dtype=np.float64)[:2].copy(), target_yaw=float(block_yaw)
    )
    return MotionPlan(
        start_ns=int(start_ns),
        end_ns=int(start_ns) + int(round(float(knot_s[-1]) * 1e9)),
        knot_s=knot_s,
        knot_position=np.array([start] + [p[1] for p in phases]),
        knot_yaw=np.array([yaw0] + [p[2] for p in phases]),
        knot_width=np.array([float(width)] + [p[3] for p in phases]),
        tilt_rad=(float(roll - tremor[3]), float(pitch - tremor[4])),
        wobble_hz=wobble_hz,
        wobble_phase=wobble_phase,
        wobble_amp=wobble_amp,
        attach_s=float(knot_s[attach_knot]),
        release_s=float(knot_s[release_knot]),
        scene=taken_over,
        grip_offset_tool=grip,
    )


def _strayed(rng: np.random.Generator, phases: list[tuple]) -> tuple[list[tuple], int, int]:
    """The plain plan's phases with three strays, each followed by a correction back to the plain
    plan's knot: the approach ends 3-7 cm off in a random direction (and +-2 cm in height, the
    fingers turned by up to 20 deg); the descent stops 2-4 cm above the grasp and 1-2.5 cm beside
    it; the carry ends 2-5 cm from the spot over the mark. Returns the phases and the knots that
    start holding and release the block."""

    def offset(low: float, high: float) -> np.ndarray:
        # Any direction: a demonstrator errs every way.
        angle = float(rng.uniform(-math.pi, math.pi))
        return float(rng.uniform(low, high)) * np.array([math.cos(angle), math.sin(angle)])

    hold, approach, descend, close, settle, lift, carry, lower, release, retreat, rest = phases
    _, above, grasp_yaw, width_open = approach
    _, grasp, _, _ = descend
    _, over_place, place_yaw, width_closed = carry
    stray_above = np.array([*(above[:2] + offset(0.03, 0.07)), above[2] + float(rng.uniform(-0.02, 0.02))])
    stray_yaw = grasp_yaw + float(np.radians(rng.uniform(-20.0, 20.0)))
    short_of_grasp = np.array([*(grasp[:2] + offset(0.01, 0.025)), grasp[2] + float(rng.uniform(0.02, 0.04))])
    stray_over_place = np.array([*(over_place[:2] + offset(0.02, 0.05)), over_place[2]])
    correct = lambda: float(rng.uniform(0.5, 0.9))  # noqa: E731
    strayed = [
        hold,
        (approach[0], stray_above, stray_yaw, width_open),
        (correct(), above, grasp_yaw, width_open),
        (descend[0] * 0.7, short_of_grasp, grasp_yaw, width_open),
        (correct(), grasp, grasp_yaw, width_open),
        close,
        settle,
        lift,
        (carry[0], stray_over_place, place_yaw, width_closed),
        (correct(), over_place, place_yaw, width_closed),
        lower,
        release,
        retreat,
        rest,
    ]
    return strayed, 6, 11
