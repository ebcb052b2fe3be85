"""The on-disk dataset (zarr v3), as keys and shapes.

| key                              | dtype, shape      | meaning                                             |
| -------------------------------- | ----------------- | --------------------------------------------------- |
| data/camera0_rgb                 | uint8 (N,H,W,3)   | camera frame, RGB, resized to convert.image_size    |
| data/robot0_eef_pos              | float32 (N,3)     | gripper TCP position, VIO world frame, metres       |
| data/robot0_eef_rot_axis_angle   | float32 (N,3)     | its orientation as an axis-angle vector             |
| data/robot0_gripper_width        | float32 (N,1)     | finger opening, metres                              |
| data/timestamp                   | float64 (N,)      | capture time, s since the episode's first kept frame|
| meta/episode_ends                | int64 (E,)        | exclusive end index of each episode                 |

Root attributes (`ATTRS_*`): format version, dataset frequency, image size, the conversion
params, and one record per episode. Frames of episode e are `episode_ends[e-1]:episode_ends[e]`.
"""

from __future__ import annotations

FORMAT_VERSION = 1

RGB = "data/camera0_rgb"
EEF_POS = "data/robot0_eef_pos"
EEF_ROT = "data/robot0_eef_rot_axis_angle"
GRIPPER_WIDTH = "data/robot0_gripper_width"
TIMESTAMP = "data/timestamp"
EPISODE_ENDS = "meta/episode_ends"

LOWDIM_KEYS = (EEF_POS, EEF_ROT, GRIPPER_WIDTH)

ATTRS_FORMAT = "policypipe_format_version"
ATTRS_FREQUENCY = "frequency_hz"
ATTRS_IMAGE_SIZE = "image_size"
ATTRS_PARAMS = "convert_params"
ATTRS_EPISODES = "episodes"

# Frames per shard file of the image array: the file count stays ~N/100 (DVC-friendly) while one
# random frame is one small chunk read through the shard index.
FRAMES_PER_SHARD = 100
# Low-dimensional arrays are tiny: a few large chunks.
LOWDIM_CHUNK = 16384
