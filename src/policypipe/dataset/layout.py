"""The on-disk dataset (zarr v3) as named constants: its keys, root attributes and format version.

docs/dataset.md has the full table (dtypes, shapes, meaning), the episode clock and the root
attributes. In short: `data/` holds one row per frame of camera 0 (the dataset's clock), with every
kept gripper's pose and width interpolated at its capture time and every other kept camera's frame
nearest in time; `streams/` the recorded pose and width samples themselves, per gripper, so windows
are sampled on the time axis, never by frame index; `meta/*episode_ends` the exclusive end index of
each episode's rows (episode e is `ends[e-1]:ends[e]`).

Grippers are numbered i = 0, 1, ... and cameras k = 0, 1, ... as in the recordings
(recording-format.md, "Version 2"); the keys below are gripper 0's and camera 0's, and the functions
name any other's.
"""

from __future__ import annotations

# A store of another version is refused when its windows are read: rebuild it with `dvc repro convert`.
# 3: per-gripper stream keys (`streams/robot{i}_pose_timestamp`, ...), cameras beyond camera 0.
FORMAT_VERSION = 3


def camera_rgb(k: int) -> str:
    """Camera k's frames, RGB, resized to convert.image_size (camera 0: the clock's own frames)."""
    return f"data/camera{k}_rgb"


def camera_offset(k: int) -> str:
    """Camera k >= 1: its frame's capture time minus the row's (camera 0's), seconds."""
    return f"data/camera{k}_offset"


def camera_valid(k: int) -> str:
    """Camera k >= 1: whether the row has a frame of it within convert.max_camera_offset_ms."""
    return f"data/camera{k}_valid"


def eef_pos(i: int) -> str:
    return f"data/robot{i}_eef_pos"  # gripper i's TCP position at each frame


def eef_rot(i: int) -> str:
    return f"data/robot{i}_eef_rot_axis_angle"  # its orientation at each frame, axis-angle


def gripper_width(i: int) -> str:
    return f"data/robot{i}_gripper_width"  # its finger opening at each frame


def pose_timestamp(i: int) -> str:
    return f"streams/robot{i}_pose_timestamp"  # time of each recorded VIO pose sample of gripper i


def pose_pos(i: int) -> str:
    return f"streams/robot{i}_eef_pos"  # its TCP position


def pose_rot(i: int) -> str:
    return f"streams/robot{i}_eef_rot_axis_angle"  # its orientation, axis-angle


def width_timestamp(i: int) -> str:
    return f"streams/robot{i}_width_timestamp"  # time of each recorded width sample of gripper i


def width(i: int) -> str:
    return f"streams/robot{i}_gripper_width"  # its finger opening


def pose_episode_ends(i: int) -> str:
    return f"meta/robot{i}_pose_episode_ends"  # exclusive end index of each episode's pose samples


def width_episode_ends(i: int) -> str:
    return f"meta/robot{i}_width_episode_ends"  # exclusive end index of each episode's width samples


RGB = camera_rgb(0)
EEF_POS, EEF_ROT, GRIPPER_WIDTH = eef_pos(0), eef_rot(0), gripper_width(0)
TIMESTAMP = "data/timestamp"  # each frame's own capture time (camera 0's), episode clock
EPISODE_ENDS = "meta/episode_ends"  # exclusive end index of each episode's frames
POSE_TIMESTAMP, POSE_POS, POSE_ROT = pose_timestamp(0), pose_pos(0), pose_rot(0)
WIDTH_TIMESTAMP, WIDTH = width_timestamp(0), width(0)
POSE_EPISODE_ENDS, WIDTH_EPISODE_ENDS = pose_episode_ends(0), width_episode_ends(0)


def lowdim_keys(i: int) -> tuple[str, str, str]:
    """Gripper i's per-frame low-dimensional arrays."""
    return eef_pos(i), eef_rot(i), gripper_width(i)


LOWDIM_KEYS = lowdim_keys(0)

ATTRS_FORMAT = "policypipe_format_version"  # FORMAT_VERSION of the store
ATTRS_FREQUENCY = "frequency_hz"  # the dataset's frequency, measured from camera 0's frames
ATTRS_IMAGE_SIZE = "image_size"  # [W, H] of the stored frames
ATTRS_PARAMS = "convert_params"  # the conversion params it was made with
ATTRS_EPISODES = "episodes"  # one record per episode (stem, folder, counts, warnings, ...)
ATTRS_GRIPPERS = "grippers"  # the gripper numbers the dataset keeps, e.g. [0] or [0, 1]
ATTRS_CAMERAS = "cameras"  # the camera numbers it keeps, camera 0 first

# A joint-space dataset (an ALOHA / RDT source, `dataset.joint`; docs/dataset.md, "Joint-space
# datasets"): joint vectors instead of gripper poses, no `streams/`, `grippers` [].
JOINT_STATE = "data/joint_state"  # (N, D) the joint vector at each row
JOINT_ACTION = "data/joint_action"  # (N, D) the command issued at each row
ATTRS_REPRESENTATION = "representation"  # JOINT_REPRESENTATION (a dataset of gripper poses has none)
JOINT_REPRESENTATION = "joint"
ATTRS_JOINT_NAMES = "joint_names"  # the D dimensions' names, in order
ATTRS_GRIPPER_JOINTS = "gripper_joints"  # those of them that are grippers (`gripper_joints`)


def gripper_joints(names: tuple[str, ...] | list[str]) -> list[str]:
    """The dimensions that are grippers: those whose name says so."""
    return [name for name in names if "gripper" in name]


def is_joint_space(attrs) -> bool:
    """Whether a store (its root attributes) holds joint vectors rather than gripper poses."""
    return attrs.get(ATTRS_REPRESENTATION) == JOINT_REPRESENTATION


# Frames per shard file of the image array: the file count stays ~N/100 (DVC-friendly) while one
# random frame is one small chunk read through the shard index.
FRAMES_PER_SHARD = 100
# Low-dimensional arrays are tiny: a few large chunks.
LOWDIM_CHUNK = 16384
