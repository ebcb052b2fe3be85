"""The on-disk dataset (zarr v3) as named constants: its keys, root attributes and format version.

docs/dataset.md has the full table (dtypes, shapes, meaning), the episode clock and the root
attributes. In short: `data/` holds one row per kept camera frame, with pose and width
interpolated at its capture time; `streams/` the recorded pose and width samples themselves, so
windows are sampled on the time axis, never by frame index; `meta/*episode_ends` the exclusive
end index of each episode's rows (episode e is `ends[e-1]:ends[e]`).
"""

from __future__ import annotations

# A store of another version is refused when its windows are read: rebuild it with `dvc repro convert`.
FORMAT_VERSION = 2

RGB = "data/camera0_rgb"  # the frames, RGB, resized to convert.image_size
EEF_POS = "data/robot0_eef_pos"  # gripper TCP position at each frame
EEF_ROT = "data/robot0_eef_rot_axis_angle"  # its orientation at each frame, axis-angle
GRIPPER_WIDTH = "data/robot0_gripper_width"  # finger opening at each frame
TIMESTAMP = "data/timestamp"  # each frame's own capture time, episode clock
EPISODE_ENDS = "meta/episode_ends"  # exclusive end index of each episode's frames
POSE_TIMESTAMP = "streams/pose_timestamp"  # time of each recorded VIO pose sample
POSE_POS = "streams/robot0_eef_pos"  # its TCP position
POSE_ROT = "streams/robot0_eef_rot_axis_angle"  # its orientation, axis-angle
WIDTH_TIMESTAMP = "streams/width_timestamp"  # time of each recorded width sample
WIDTH = "streams/robot0_gripper_width"  # its finger opening
POSE_EPISODE_ENDS = "meta/pose_episode_ends"  # exclusive end index of each episode's pose samples
WIDTH_EPISODE_ENDS = "meta/width_episode_ends"  # exclusive end index of each episode's width samples

# The per-frame low-dimensional arrays.
LOWDIM_KEYS = (EEF_POS, EEF_ROT, GRIPPER_WIDTH)

ATTRS_FORMAT = "policypipe_format_version"  # FORMAT_VERSION of the store
ATTRS_FREQUENCY = "frequency_hz"  # the dataset's frequency, measured from the frames
ATTRS_IMAGE_SIZE = "image_size"  # [W, H] of the stored frames
ATTRS_PARAMS = "convert_params"  # the conversion params it was made with
ATTRS_EPISODES = "episodes"  # one record per episode (stem, folder, counts, warnings, ...)

# Frames per shard file of the image array: the file count stays ~N/100 (DVC-friendly) while one
# random frame is one small chunk read through the shard index.
FRAMES_PER_SHARD = 100
# Low-dimensional arrays are tiny: a few large chunks.
LOWDIM_CHUNK = 16384
