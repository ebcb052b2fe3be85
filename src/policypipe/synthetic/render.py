"""The wrist camera's view of the scene: pinhole projection, the table's texture, the target and
the fingers, and a machine-readable timecode drawn into the top of each frame (so a test can
tell which capture time a stored frame shows).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.synthetic.motion import MotionPlan
from policypipe.synthetic.scene import (
    CAMERA_OFFSET_TOOL,
    FINGER_BASE_Z_M,
    FINGER_BGR,
    FINGER_PAD_BGR,
    FINGER_THICKNESS_M,
    FINGER_TIP_Z_M,
    FLOOR_BGR,
    FOCAL_PER_WIDTH,
    GRIPPER_BODY_BGR,
    PLACE_MARK_BGR,
    R_TOOL_CAM,
    TABLE_SIZE_M,
    TARGET_SIDE_BGR,
    TARGET_TOP_BGR,
    TEXTURE_M_PER_PX,
    TIMECODE_BITS,
    TIMECODE_CELLS,
    TIMECODE_STRIP_FRACTION,
    WIDTH_OPEN_M,
    Scene,
)

# --- rendering ----------------------------------------------------------------------------


def camera_matrix(width: int, height: int) -> np.ndarray:
    f = FOCAL_PER_WIDTH * width
    return np.array([[f, 0.0, width / 2.0], [0.0, f, height / 2.0], [0.0, 0.0, 1.0]])


def camera_in_world(position: np.ndarray, quat_xyzw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Camera rotation (N, 3, 3) (columns: camera axes in the world) and centre (N, 3),
    from TCP poses (N, 3), (N, 4)."""
    r_world_tool = Rotation.from_quat(quat_xyzw).as_matrix()
    return r_world_tool @ R_TOOL_CAM, position + r_world_tool @ CAMERA_OFFSET_TOOL


def project(points_world: np.ndarray, r_world_cam: np.ndarray, centre: np.ndarray, k: np.ndarray):
    """Pixels (P, 2) and depths (P,) of world points (P, 3) seen by one camera."""
    cam = (points_world - centre) @ r_world_cam  # rows: R^T (p - c)
    depth = cam[:, 2]
    uv = (cam @ k.T)[:, :2] / np.maximum(depth, 1e-9)[:, None]
    return uv, depth


def table_texture(scene: Scene, marks: tuple[tuple[np.ndarray, float], ...] | None = None) -> np.ndarray:
    """(T, T, 3) uint8 BGR top view of the table, TEXTURE_M_PER_PX per pixel: a base colour
    with slow blotches, tape lines every 10 cm, scattered marks (so motion is visible
    everywhere) and the blue place markers: `marks` as (centre, yaw), by default the scene's one."""
    rng = np.random.default_rng(scene.texture_seed)
    n = int(round(TABLE_SIZE_M / TEXTURE_M_PER_PX))
    blotch = cv2.resize(
        rng.uniform(-14, 14, size=(7, 7)).astype(np.float32), (n, n), interpolation=cv2.INTER_CUBIC
    )
    tex = np.clip(np.array(scene.table_bgr, np.float32)[None, None] + blotch[..., None], 0, 255).astype(
        np.uint8
    )
    dark = tuple(int(c * 0.72) for c in scene.table_bgr)
    light = tuple(min(255, int(c * 1.2) + 10) for c in scene.table_bgr)
    step = int(round(0.1 / TEXTURE_M_PER_PX))
    for i in range(step // 2, n, step):
        cv2.line(tex, (i, 0), (i, n - 1), dark, 1, cv2.LINE_AA)
        cv2.line(tex, (0, i), (n - 1, i), dark, 1, cv2.LINE_AA)
    for _ in range(90):
        centre = (int(rng.integers(n)), int(rng.integers(n)))
        colour = dark if rng.random() < 0.6 else light
        if rng.random() < 0.5:
            axes = (int(rng.integers(3, 14)), int(rng.integers(3, 14)))
            cv2.ellipse(tex, centre, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
        else:
            end = (centre[0] + int(rng.integers(-40, 40)), centre[1] + int(rng.integers(-40, 40)))
            cv2.line(tex, centre, end, colour, int(rng.integers(2, 5)), cv2.LINE_AA)
    # Place markers: square outlines, 9 cm.
    for centre, yaw in ((scene.place_xy, scene.place_yaw),) if marks is None else marks:
        corners = _rectangle(np.asarray(centre), yaw, 0.09, 0.09)
        pix = ((corners - _texture_origin(scene)) / TEXTURE_M_PER_PX * 16).round().astype(np.int32)
        cv2.polylines(tex, [pix], True, PLACE_MARK_BGR, 5, cv2.LINE_AA, shift=4)
    return tex


def _texture_origin(scene: Scene) -> np.ndarray:
    return scene.table_center - TABLE_SIZE_M / 2.0


def _rectangle(centre_xy: np.ndarray, yaw: float, length: float, width: float) -> np.ndarray:
    """(4, 2) corners of a rectangle on the table, `length` along `yaw`."""
    along = np.array([math.cos(yaw), math.sin(yaw)]) * length / 2.0
    across = np.array([-math.sin(yaw), math.cos(yaw)]) * width / 2.0
    return centre_xy + np.array([along + across, along - across, -along - across, -along + across])


def _box_corners(centre: np.ndarray, yaw: float, size: tuple[float, float, float]) -> np.ndarray:
    """(8, 3) corners of the target block: bottom four, then top four."""
    rect = _rectangle(centre[:2], yaw, size[1], size[0])
    bottom = np.column_stack([rect, np.full(4, centre[2] - size[2] / 2.0)])
    top = np.column_stack([rect, np.full(4, centre[2] + size[2] / 2.0)])
    return np.vstack([bottom, top])


def _fixed(uv: np.ndarray) -> np.ndarray:
    # cv2 draws sub-pixel polygons from 28.4 fixed-point coordinates (shift=4).
    return np.round(np.clip(uv, -1e5, 1e5) * 16).astype(np.int32)


def render_frames_bgr(
    plan: MotionPlan,
    t_ns: np.ndarray,
    image_size: tuple[int, int],
    *,
    timecode: bool = False,
    texture: np.ndarray | None = None,
):
    """Yields one (H, W, 3) uint8 BGR wrist-camera image per capture time in `t_ns` (N,)."""
    tex = table_texture(plan.scene) if texture is None else texture
    t_ns = np.asarray(t_ns, dtype=np.int64)
    position, quat = plan.pose_at(t_ns)
    target_centre, target_yaw = plan.target_at(t_ns)
    grip = plan.width_at(t_ns)
    for i in range(len(t_ns)):
        image = render_view_bgr(
            plan.scene,
            tex,
            position[i],
            quat[i],
            target_centre[i],
            float(target_yaw[i]),
            float(grip[i]),
            image_size,
        )
        if timecode:
            draw_timecode(image, timecode_value(int(t_ns[i])))
        yield image


def render_view_bgr(
    scene: Scene,
    texture: np.ndarray,
    position: np.ndarray,
    quat_xyzw: np.ndarray,
    target_centre: np.ndarray,
    target_yaw: float,
    width_m: float,
    image_size: tuple[int, int],
    other_blocks: tuple[tuple[np.ndarray, float, tuple[float, float, float]], ...] = (),
) -> np.ndarray:
    """(H, W, 3) uint8 BGR: the wrist camera's view with the TCP at `position` (3,) and `quat_xyzw`
    (4,), the target block at `target_centre` (3,) turned by `target_yaw`, the fingers `width_m`
    apart; `texture` is `table_texture(scene)`. What the recordings and the simulator both draw.
    `other_blocks` (centre, yaw, size) are further blocks on the table (another gripper's)."""
    width, height = image_size
    k = camera_matrix(width, height)
    (r_cam,), (c_cam,) = camera_in_world(np.asarray(position)[None], np.asarray(quat_xyzw)[None])
    image = _table_view(scene, texture, r_cam, c_cam, k, image_size)
    blocks = [(np.asarray(target_centre), target_yaw, scene.target_size), *other_blocks]
    for centre, yaw, size in _farthest_first(blocks, c_cam):
        _draw_target(image, _box_corners(centre, yaw, size), r_cam, c_cam, k)
    _draw_fingers(image, width_m, k)
    return image


def render_fixed_view_bgr(
    scene: Scene,
    texture: np.ndarray,
    r_world_cam: np.ndarray,
    centre: np.ndarray,
    blocks: list[tuple[np.ndarray, float, tuple[float, float, float]]],
    grippers: list[tuple[np.ndarray, np.ndarray, float]],
    image_size: tuple[int, int],
) -> np.ndarray:
    """(H, W, 3) uint8 BGR: a fixed camera's view (rotation (3, 3), columns: camera axes in the
    world; centre (3,)) of the table, the `blocks` (centre, yaw, size) and the `grippers` (TCP
    position, quaternion, opening), nearer things drawn over farther ones."""
    k = camera_matrix(*image_size)
    image = _table_view(scene, texture, r_world_cam, centre, k, image_size)
    things = [("block", b[0], b) for b in blocks] + [("gripper", g[0], g) for g in grippers]
    for kind, _, thing in sorted(things, key=lambda item: -float(np.linalg.norm(item[1] - centre))):
        if kind == "block":
            _draw_target(
                image, _box_corners(np.asarray(thing[0]), thing[1], thing[2]), r_world_cam, centre, k
            )
        else:
            _draw_gripper(image, *thing, r_world_cam, centre, k)
    return image


def _table_view(
    scene: Scene,
    texture: np.ndarray,
    r_cam: np.ndarray,
    c_cam: np.ndarray,
    k: np.ndarray,
    size: tuple[int, int],
) -> np.ndarray:
    """The table plane z = 0 (its texture) as the camera sees it, the floor beyond it."""
    origin = _texture_origin(scene)
    texture_to_world = np.array(
        [[TEXTURE_M_PER_PX, 0.0, origin[0]], [0.0, TEXTURE_M_PER_PX, origin[1]], [0.0, 0.0, 1.0]]
    )
    r_cw = r_cam.T
    # Homography from the table plane z=0 to the image: K [r1 r2 t] (standard plane pose).
    plane_to_image = k @ np.column_stack([r_cw[:, 0], r_cw[:, 1], -r_cw @ c_cam])
    return cv2.warpPerspective(
        texture,
        plane_to_image @ texture_to_world,
        size,
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=FLOOR_BGR,
    )


def _farthest_first(blocks: list, c_cam: np.ndarray) -> list:
    """One block: as it is (the recordings' bytes); more: the nearer drawn over the farther."""
    if len(blocks) == 1:
        return blocks
    return sorted(blocks, key=lambda b: -float(np.linalg.norm(np.asarray(b[0]) - c_cam)))


def render_frame(
    plan: MotionPlan, t_ns: int, image_size: tuple[int, int] = (320, 240), *, timecode: bool = False
) -> np.ndarray:
    """One (H, W, 3) uint8 RGB wrist-camera image at capture time `t_ns`."""
    bgr = next(render_frames_bgr(plan, np.array([t_ns]), image_size, timecode=timecode))
    return np.ascontiguousarray(bgr[..., ::-1])


def _draw_target(
    image: np.ndarray, corners: np.ndarray, r_cam: np.ndarray, c_cam: np.ndarray, k: np.ndarray
) -> None:
    uv, depth = project(corners, r_cam, c_cam, k)
    if depth.min() < 0.02:  # behind or touching the lens: not drawn (never happens in a plan)
        return
    hull = cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2)
    cv2.fillConvexPoly(image, _fixed(hull), TARGET_SIDE_BGR, cv2.LINE_AA, shift=4)
    cv2.fillConvexPoly(image, _fixed(uv[4:]), TARGET_TOP_BGR, cv2.LINE_AA, shift=4)


def _draw_fingers(image: np.ndarray, width_m: float, k: np.ndarray) -> None:
    """Two finger plates at the bottom of the image; rigid on the camera, so only their gap
    moves."""
    for side in (-1.0, 1.0):
        inner = side * width_m / 2.0
        plate = _finger_plate(width_m, side)
        uv, _ = project(plate, R_TOOL_CAM, CAMERA_OFFSET_TOOL, k)
        # The finger's root continues straight down out of the image, to the gripper body.
        root = uv[np.argsort(uv[:, 1])[-2:]]
        uv = np.vstack([uv, np.column_stack([root[:, 0], np.full(2, image.shape[0] + 2.0)])])
        hull = cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2)
        cv2.fillConvexPoly(image, _fixed(hull), FINGER_BGR, cv2.LINE_AA, shift=4)
        # The rubber pad on the inner face near the tip: dark, shows where the fingers touch.
        pad = np.array(
            [[x, inner, z] for x in (-0.008, 0.008) for z in (FINGER_TIP_Z_M, FINGER_TIP_Z_M - 0.02)]
        )
        uv, _ = project(pad, R_TOOL_CAM, CAMERA_OFFSET_TOOL, k)
        hull = cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2)
        cv2.fillConvexPoly(image, _fixed(hull), FINGER_PAD_BGR, cv2.LINE_AA, shift=4)


def _finger_plate(width_m: float, side: float) -> np.ndarray:
    """(8, 3) corners of one finger plate in the tool frame: 1.6 cm deep along x."""
    inner = side * width_m / 2.0
    outer = side * (width_m / 2.0 + FINGER_THICKNESS_M)
    return np.array(
        [
            [x, y, z]
            for x in (-0.008, 0.008)
            for y in (inner, outer)
            for z in (FINGER_TIP_Z_M, FINGER_BASE_Z_M)
        ]
    )


def _draw_gripper(
    image: np.ndarray,
    position: np.ndarray,
    quat_xyzw: np.ndarray,
    width_m: float,
    r_cam: np.ndarray,
    c_cam: np.ndarray,
    k: np.ndarray,
) -> None:
    """A gripper seen from a fixed camera: its body above the fingers, then both finger plates."""
    r_world_tool = Rotation.from_quat(quat_xyzw).as_matrix()
    half = WIDTH_OPEN_M / 2.0 + FINGER_THICKNESS_M
    body = np.array(
        [
            [x, y, z]
            for x in (-0.025, 0.025)
            for y in (-half, half)
            for z in (FINGER_BASE_Z_M, FINGER_BASE_Z_M - 0.05)
        ]
    )
    for corners, colour in (
        (body, GRIPPER_BODY_BGR),
        (_finger_plate(width_m, -1.0), FINGER_BGR),
        (_finger_plate(width_m, 1.0), FINGER_BGR),
    ):
        uv, depth = project(np.asarray(position) + corners @ r_world_tool.T, r_cam, c_cam, k)
        if depth.min() < 0.02:
            continue
        hull = cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2)
        cv2.fillConvexPoly(image, _fixed(hull), colour, cv2.LINE_AA, shift=4)


# --- timecode -----------------------------------------------------------------------------


def timecode_value(t_ns: int) -> int:
    """What the timecode of a frame captured at `t_ns` encodes: the capture time in whole
    milliseconds, modulo 2**20 (unique within any 17 minutes, longer than a recording)."""
    return (int(t_ns) // 1_000_000) % (1 << TIMECODE_BITS)


def _timecode_cells(value: int) -> list[int]:
    bits = [(value >> (TIMECODE_BITS - 1 - i)) & 1 for i in range(TIMECODE_BITS)]
    return [1, 0, *bits, sum(bits) % 2, 0]


def draw_timecode(image: np.ndarray, value: int) -> None:
    """Draws `value` (0 <= value < 2**20) as a strip of 24 black/white cells across the top
    sixth of the image, in place. Each cell is 1/24 of the width, big enough to survive
    JPEG, H.264 and a resize down to 64x48."""
    if not 0 <= value < (1 << TIMECODE_BITS):
        raise ValueError(f"timecode value {value} does not fit {TIMECODE_BITS} bits")
    height, width = image.shape[:2]
    strip = max(2, int(round(height * TIMECODE_STRIP_FRACTION)))
    for i, bit in enumerate(_timecode_cells(value)):
        x0 = int(round(i * width / TIMECODE_CELLS))
        x1 = int(round((i + 1) * width / TIMECODE_CELLS))
        image[:strip, x0:x1] = 255 if bit else 0


def read_timecode(rgb_image: np.ndarray) -> int:
    """The value drawn by `draw_timecode` (see `timecode_value`: capture time in ms modulo
    2**20) from an RGB or grey image of any size down to 64x48. Raises ValueError when the
    strip is not there (reference cells or parity do not check out)."""
    image = np.asarray(rgb_image, dtype=np.float64)
    grey = image.mean(axis=2) if image.ndim == 3 else image
    height, width = grey.shape
    strip = height * TIMECODE_STRIP_FRACTION
    rows = slice(int(strip * 0.25), max(int(strip * 0.25) + 1, int(math.ceil(strip * 0.75))))
    levels = []
    for i in range(TIMECODE_CELLS):
        # The middle third of each cell: away from the edges that compression smears.
        x0 = int(math.floor((i + 1 / 3) * width / TIMECODE_CELLS))
        x1 = max(x0 + 1, int(math.ceil((i + 2 / 3) * width / TIMECODE_CELLS)))
        levels.append(float(grey[rows, x0:x1].mean()))
    white, black = levels[0], levels[1]
    if white - black < 60.0:
        raise ValueError("no timecode strip in this image (reference cells lack contrast)")
    cells = [int(level > (white + black) / 2.0) for level in levels]
    bits = cells[2 : 2 + TIMECODE_BITS]
    if cells[-1] != 0 or cells[2 + TIMECODE_BITS] != sum(bits) % 2:
        raise ValueError("timecode strip unreadable (parity check failed)")
    return int("".join(map(str, bits)), 2)
