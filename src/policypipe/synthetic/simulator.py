"""The sample scene as a simulator, for closed-loop rollouts: the gripper follows absolute,
timed targets (what `policypipe.runtime`'s runner sends a robot), and the block is gripped,
carried and released by rules as simple as honest.

State: the TCP pose, the finger opening, the block's pose and whether it is held.

Tracking: ideal by default (the gripper is where the last target put it, the table permitting); with
`SimConfig.max_speed_m_s` the TCP moves towards a target at most that fast, and with
`SimConfig.latency_ns` every target takes effect that much later.

Contact, in the tool frame (`scene`: the fingers close along tool y, the fingertips reach
FINGER_TIP_Z_M beyond the TCP along the approach axis, each finger plate spans +-FINGER_HALF_DEPTH_M
along tool x). The block's extent across the fingers is that of its footprint seen along tool y
(the narrow side when the fingers are square to it, more when turned). Closing means the opening
falls below that extent. The block is gripped if, at that moment, it lies between the fingers:
- across (tool y): both faces inside the widest opening since the fingers last closed, with
  GRIP_SLACK_M to spare (closing fingers push a block that lies between them to their middle: it
  slides there across the table, as on a parallel gripper);
- along (tool x): the block's extent overlaps a finger plate;
- along the approach (tool z): the fingers reach at least GRIP_MIN_DEPTH_M down the block's sides,
  and the fingertips are above the table (they cannot pass through it);
- square (about the approach axis): its sides within SQUARE_MAX_DEG of square to the fingers (the
  narrow side across them). Closing parallel fingers turn such a block square about its centre as
  they meet it (a squeeze, as on a real parallel gripper: the block's extent across the fingers is
  smallest square, and closing fingers push it down that slope); turned further, the pads meet it
  on two corners, stall there and slip off as they close: nothing is gripped. The limit is a
  modelling assumption, not a measurement of a real pad (docs/rollout.md, "The simulator"): 30
  degrees, where the demonstrations close within 1 degree of square and a person's hand arrives
  10-40 degrees turned and corrects before closing.
Then the fingers stop on the block, square: their opening reads its narrow side less
GRIP_SQUEEZE_M (the compliant pads' give, as the demonstrations read it), the block is centred
between them and keeps its pose relative to them. Closing anywhere else grips nothing (counted).
Once the command has reached the block's narrow side, opening past it releases it: it falls
straight down and comes to rest on the table where it is, with its yaw; released with its bottom
more than DROP_HEIGHT_M above the table it fell (a failure), and off the table it is lost.
Collisions are not simulated: the fingers pass through the block; only the table stops them (a
target below its top leaves the fingertips on it).

Success: the block released, resting on the table, its centre within PLACE_RADIUS_M of the place
mark's centre, before the time limit. PLACE_RADIUS_M is 20 mm: over 3,000 of the generator's
plans (`plan_motion`), the demonstrations place the block's centre 4.9 mm from the mark's centre
in the median, 12.4 mm at the 99th percentile and 16.3 mm at most (docs/sample-data.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.synthetic.scene import FINGER_TIP_Z_M, GRIP_SQUEEZE_M, TABLE_SIZE_M, WIDTH_OPEN_M, Scene

NS = 1_000_000_000
FINGER_HALF_DEPTH_M = 0.008  # finger plates span +-8 mm along tool x (render._draw_fingers)
GRIP_SLACK_M = 0.002
GRIP_MIN_DEPTH_M = 0.008
DROP_HEIGHT_M = 0.010
PLACE_RADIUS_M = 0.020
SQUARE_MAX_DEG = 30.0  # closing fingers square a block turned at most this far (the module's docstring)

# What ends an episode, and how (`Simulator.outcome`).
OUTCOMES = (
    "success",
    "never_closed_on_block",  # the fingers never closed
    "closed_on_nothing",  # they closed, but never on the block
    "dropped",  # released in the air, or off the table
    "placed_off_mark",  # released and at rest, but farther than PLACE_RADIUS_M from the mark
    "timed_out",  # still holding it (or grasped and nothing more) at the time limit
)


@dataclass(frozen=True)
class SimConfig:
    """How the simulated gripper follows its targets."""

    latency_ns: int = 0  # every target takes effect this much later than its time
    max_speed_m_s: float | None = None  # None: ideal tracking (the TCP is where the target puts it)

    def __post_init__(self) -> None:
        if self.latency_ns < 0:
            raise ValueError(f"latency_ns must be >= 0, got {self.latency_ns}")
        if self.max_speed_m_s is not None and not self.max_speed_m_s > 0:
            raise ValueError(f"max_speed_m_s must be > 0 (or None: ideal tracking), got {self.max_speed_m_s}")


@dataclass
class SimState:
    """The scene at `t_ns`: world frame, metres; the block's centre and its yaw about world z."""

    t_ns: int
    position: np.ndarray  # (3,) TCP
    quaternion: np.ndarray  # (4,) xyzw, world <- tool
    width: float  # finger opening
    block_centre: np.ndarray  # (3,)
    block_yaw: float
    held: bool = False


@dataclass
class _Grip:
    centre_in_tool: np.ndarray  # (3,) the block's centre in the tool frame
    yaw_in_tool: float  # the block's yaw less the tool's heading
    opening: float  # the block's extent across the fingers (square: its narrow side)
    # Whether the command has reached the block since the grip: a block squared as the fingers met it
    # is narrower than where they met it, and only an opening after they reached it releases it.
    reached: bool = False


@dataclass
class Simulator:
    """One episode in `scene`, from the start `state`."""

    scene: Scene
    state: SimState
    config: SimConfig = field(default_factory=SimConfig)
    closes_on_nothing: int = 0
    grasps: int = 0
    release: str | None = None  # None until released: "resting" or "dropped"
    # Where the block was, in the tool frame, at each close that gripped nothing (a failure's why).
    missed_closes: list[dict[str, float]] = field(default_factory=list)
    # Where the block was let go (`_release`): its bottom's height over the table and its centre's
    # distance from the mark's, in metres, and whether it fell (a drop's why: opened in the carry, or
    # over the mark but too high).
    released_at: dict[str, float | bool] | None = None
    _grip: _Grip | None = None
    _closing: bool = False  # the opening is below the block's extent (a close in progress)
    _widest: float = 0.0  # the widest opening since the fingers last closed

    def step(self, t_ns: int, position: np.ndarray, quaternion: np.ndarray, width: float) -> SimState:
        """Moves to the target meant for `t_ns` (reached at `t_ns + latency_ns`) and applies contact."""
        s = self.state
        arrive_ns = int(t_ns) + self.config.latency_ns
        target = np.asarray(position, dtype=np.float64)
        if self.config.max_speed_m_s is not None:
            reach = self.config.max_speed_m_s * max(arrive_ns - s.t_ns, 0) / NS
            offset = target - s.position
            distance = float(np.linalg.norm(offset))
            if distance > reach:
                target = s.position + offset * (reach / distance)
        s.t_ns = max(arrive_ns, s.t_ns)
        s.quaternion = np.asarray(quaternion, dtype=np.float64) / np.linalg.norm(quaternion)
        # The table stops the fingers: a target below it leaves the fingertips on its top.
        tips_z = target[2] + (Rotation.from_quat(s.quaternion).as_matrix() @ [0.0, 0.0, FINGER_TIP_Z_M])[2]
        s.position = target + [0.0, 0.0, max(0.0, -tips_z)]
        self._contact(float(np.clip(width, 0.0, WIDTH_OPEN_M)))
        return s

    def _contact(self, commanded: float) -> None:
        s = self.state
        r_world_tool = Rotation.from_quat(s.quaternion).as_matrix()
        if self._grip is not None:
            self._grip.reached |= commanded <= self._grip.opening
            if commanded > self._grip.opening and self._grip.reached:
                self._release(commanded)
                return
            # Held: the fingers stay on the block, which moves with them.
            s.width = self._grip.opening - GRIP_SQUEEZE_M
            s.block_centre = s.position + r_world_tool @ self._grip.centre_in_tool
            s.block_yaw = _heading(r_world_tool) + self._grip.yaw_in_tool
            return
        extent = self._extent_across(r_world_tool)
        if not self._closing:
            self._widest = max(self._widest, s.width)
        if commanded < extent and not self._closing and self.release is None:
            self._closing = True
            if self._between_fingers(r_world_tool, extent, self._widest):
                self.grasps += 1
                centre_in_tool = r_world_tool.T @ (s.block_centre - s.position)
                centre_in_tool[1] = 0.0  # pushed to the middle of the fingers
                _, angle = self._block_in_tool(r_world_tool)
                squared = angle - _off_square(angle)  # turned square about its centre
                narrow = self.scene.target_size[0]
                self._grip = _Grip(centre_in_tool, squared, narrow, reached=commanded <= narrow)
                s.held = True
                s.width = narrow - GRIP_SQUEEZE_M
                s.block_centre = s.position + r_world_tool @ centre_in_tool
                s.block_yaw = _heading(r_world_tool) + squared
                return
            self.closes_on_nothing += 1
            self.missed_closes.append(self._close_geometry(r_world_tool, extent, self._widest))
        elif commanded >= extent and self._closing:
            self._closing, self._widest = False, commanded
        s.width = commanded

    def _release(self, commanded: float) -> None:
        s = self.state
        self._grip, s.held, s.width = None, False, commanded
        bottom = s.block_centre[2] - self.scene.target_size[2] / 2.0
        on_table = bool(np.all(np.abs(s.block_centre[:2] - self.scene.table_center) <= TABLE_SIZE_M / 2.0))
        self.release = "resting" if on_table and bottom <= DROP_HEIGHT_M else "dropped"
        self.released_at = {
            "height_m": float(bottom),
            "from_mark_m": self.distance_to_mark(),
            "dropped": self.release == "dropped",
        }
        if self.release == "resting":
            s.block_centre = np.array([s.block_centre[0], s.block_centre[1], self.scene.target_size[2] / 2.0])

    def _block_in_tool(self, r_world_tool: np.ndarray) -> tuple[np.ndarray, float]:
        """The block's centre in the tool frame and the angle of its long side from tool x."""
        s = self.state
        return r_world_tool.T @ (s.block_centre - s.position), s.block_yaw - _heading(r_world_tool)

    def _extent_across(self, r_world_tool: np.ndarray) -> float:
        """The block's footprint seen along tool y: its extent across the fingers."""
        narrow, long, _ = self.scene.target_size
        _, angle = self._block_in_tool(r_world_tool)
        return abs(math.cos(angle)) * narrow + abs(math.sin(angle)) * long

    def _close_geometry(self, r_world_tool: np.ndarray, extent: float, opening: float) -> dict[str, float]:
        """The block against the fingers as they close: the margins of each grip condition (a
        condition holds where its margin is >= 0), in metres, and in degrees for the turn."""
        narrow, long, height = self.scene.target_size
        centre, angle = self._block_in_tool(r_world_tool)
        along = abs(math.cos(angle)) * long + abs(math.sin(angle)) * narrow  # its extent along tool x
        # Tool z points down: the block's top face is at centre_z - height / 2 in the tool frame.
        depth = FINGER_TIP_Z_M - (centre[2] - height / 2.0)
        tips_z = (self.state.position + r_world_tool @ [0.0, 0.0, FINGER_TIP_Z_M])[2]
        return {
            "across_m": opening / 2.0 + GRIP_SLACK_M - (abs(centre[1]) + extent / 2.0),
            "along_m": along / 2.0 + FINGER_HALF_DEPTH_M - abs(centre[0]),
            "depth_m": depth - GRIP_MIN_DEPTH_M,
            "tips_above_table_m": tips_z + 1e-4,
            "square_deg": SQUARE_MAX_DEG - abs(math.degrees(_off_square(angle))),
        }

    def _between_fingers(self, r_world_tool: np.ndarray, extent: float, opening: float) -> bool:
        return min(self._close_geometry(r_world_tool, extent, opening).values()) >= 0.0

    def distance_to_mark(self) -> float:
        return float(np.linalg.norm(self.state.block_centre[:2] - self.scene.place_xy))

    def done(self) -> bool:
        """The episode's outcome is decided: the block was released."""
        return self.release is not None

    def outcome(self) -> str:
        """One of OUTCOMES, for the episode as it stands (call it at the end or the time limit)."""
        if self.release == "resting":
            return "success" if self.distance_to_mark() <= PLACE_RADIUS_M else "placed_off_mark"
        if self.release == "dropped":
            return "dropped"
        if self.grasps:
            return "timed_out"
        return "closed_on_nothing" if self.closes_on_nothing else "never_closed_on_block"


def _off_square(angle: float) -> float:
    """How far (rad, signed) a block whose long side is `angle` from tool x is turned from square to
    the fingers (its narrow side across them: angle 0 or pi), in [-pi/2, pi/2)."""
    return (angle + math.pi / 2.0) % math.pi - math.pi / 2.0


def _heading(r_world_tool: np.ndarray) -> float:
    """The direction of the tool's x axis on the table, rad (as `MotionPlan._heading`)."""
    return math.atan2(r_world_tool[1, 0], r_world_tool[0, 0])


def start_state(
    scene: Scene, t_ns: int, position: np.ndarray, quaternion: np.ndarray, width: float
) -> SimState:
    """The block on the table where the scene puts it, the gripper at the given pose."""
    return SimState(
        t_ns=int(t_ns),
        position=np.asarray(position, dtype=np.float64),
        quaternion=np.asarray(quaternion, dtype=np.float64),
        width=float(width),
        block_centre=np.array([*scene.target_xy, scene.target_size[2] / 2.0]),
        block_yaw=float(scene.target_yaw),
    )
