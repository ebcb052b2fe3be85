"""The synthetic pick-and-place scene behind the sample recordings: the table, the target, the
gripper's fingers and the wrist camera on it (`render` draws what the camera sees).

World frame (the VIO frame of the sample): z up, the table top is the plane z = 0.
Tool frame (the gripper tool-centre point, TCP): +z is the approach direction (pointing
down at the table when the gripper points down), +x is "forward" (up in the image), the
fingers close along +-y (left/right in the image).

The wrist camera is rigidly mounted behind and above the TCP and pitched forward, so the
fingers appear at the bottom of the image and the table ahead of the gripper fills the
rest. Everything the demonstrator does next (where to move, when to close) is visible in
the image and nowhere else: the target block is placed at random for every recording.

The demonstrator's motion in it is `motion.MotionPlan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

# --- the camera ---------------------------------------------------------------------------

CAMERA_PITCH_RAD = math.radians(35.0)  # optical axis tilted from tool +z towards tool +x
CAMERA_OFFSET_TOOL = np.array([-0.04, 0.0, -0.12])  # camera centre in the tool frame, m
FOCAL_PER_WIDTH = 0.6  # focal length in pixels / image width: ~80 deg horizontal field of view

# Columns: camera axes (x right, y down, z optical axis, OpenCV convention) in the tool frame.
# Without pitch: image right = tool +y, image down = tool -x, optical axis = tool +z.
R_TOOL_CAM = Rotation.from_euler("y", CAMERA_PITCH_RAD).as_matrix() @ np.array(
    [[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
)

# --- the gripper --------------------------------------------------------------------------

WIDTH_OPEN_M = 0.085
# The finger pads are compliant: closed on a block they read its width less this (each pad gives
# 2 mm under the grip force). A policy's opening may err by as much before it lets go.
GRIP_SQUEEZE_M = 0.004
FINGER_THICKNESS_M = 0.008
FINGER_TIP_Z_M = 0.012  # fingertips reach this far beyond the TCP along the approach axis
FINGER_BASE_Z_M = -0.04  # where the finger meets the gripper body (towards the camera)

# --- the table ----------------------------------------------------------------------------

TABLE_SIZE_M = 1.4
TEXTURE_M_PER_PX = 0.002
FLOOR_BGR = (58, 62, 66)
# Table colours (BGR): wood, grey, green mat, blue-grey. None of them is red, so "red pixels"
# means the target.
TABLE_PALETTE_BGR = ((120, 160, 190), (150, 150, 148), (95, 135, 90), (165, 140, 115))
TARGET_TOP_BGR = (40, 40, 215)
TARGET_SIDE_BGR = (30, 30, 150)
PLACE_MARK_BGR = (190, 110, 30)
FINGER_BGR = (78, 80, 84)
FINGER_PAD_BGR = (30, 30, 32)
GRIPPER_BODY_BGR = (110, 112, 118)  # seen only by a fixed scene camera

# --- the timecode -------------------------------------------------------------------------

TIMECODE_BITS = 20
TIMECODE_CELLS = 24  # white reference, black reference, 20 data bits (MSB first), parity, black
TIMECODE_STRIP_FRACTION = 1.0 / 6.0  # the strip covers the top sixth of the image


@dataclass(frozen=True, eq=False)
class Scene:
    """What is on the table of one recording (world frame, metres, radians)."""

    target_xy: np.ndarray  # (2,) centre of the target block on the table
    target_yaw: float  # direction of the block's long side
    target_size: tuple[float, float, float]  # (narrow side: what the gripper closes on, long side, height)
    place_xy: np.ndarray  # (2,) centre of the place marker
    place_yaw: float
    table_center: np.ndarray  # (2,)
    table_bgr: tuple[int, int, int]
    texture_seed: int
