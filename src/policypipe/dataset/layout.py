"""The on-disk dataset (zarr v3), as keys and shapes.

| key                               | dtype, shape    | meaning                                              |
| --------------------------------- | --------------- | ---------------------------------------------------- |
| data/camera0_rgb                  | uint8 (N,H,W,3) | camera frame, RGB, resized to convert.image_size     |
| data/robot0_eef_pos               | float32 (N,3)   | gripper TCP position at the frame, VIO world, metres |
| data/robot0_eef_rot_axis_angle    | float32 (N,3)   | its orientation as an axis-angle vector              |
| data/robot0_gripper_width         | float32 (N,1)   | finger opening at the frame, metres                  |
| data/timestamp                    | float64 (N,)    | the frame's own capture time, s, episode clock       |
| meta/episode_ends                 | int64 (E,)      | exclusive end index of each episode's frames         |
| streams/pose_timestamp            | float64 (P,)    | time of each recorded VIO pose sample, episode clock |
| streams/robot0_eef_pos            | float64 (P,3)   | its TCP position, metres                             |
| streams/robot0_eef_rot_axis_angle | float64 (P,3)   | its orientation as an axis-angle vector              |
| streams/width_timestamp           | float64 (W,)    | time of each recorded width sample, episode clock    |
| streams/robot0_gripper_width      | float64 (W,1)   | its finger opening, metres                           |
| meta/pose_episode_ends            | int64 (E,)      | exclusive end index of each episode's pose samples   |
| meta/width_episode_ends           | int64 (E,)      | exclusive end index of each episode's width samples  |

An episode's clock: seconds since the capture of its first kept frame (so data/timestamp starts at
0; a stream's first sample may be slightly negative).

Root attributes (`ATTRS_*`): format version, dataset frequency, image size, the conversion
params, and one record per episode (with `resample_offset_ms`, how far the frames kept by
convert.resample_hz are from its grid, or null). Frames of episode e are `episode_ends[e-1]:episode_ends[e]`,
its pose samples `pose_episode_ends[e-1]:pose_episode_ends[e]`, its width samples likewise.

The per-frame pose and width (`data/`) are interpolated at each frame's capture time. The
`streams/` arrays are the recorded samples themselves (VIO at 100-200 Hz, width at ~45 Hz),
strictly increasing in time within an episode, from the last sample at or before the episode's
first frame to the first at or after its last: pose and width can be interpolated at any time
of the episode, exactly as convert interpolates them at the frames (`recordings.episode.
PoseInterpolator` / `interpolate_width`). The policy's action and observation windows are
sampled on this time axis (`dataset.windows`), never by frame index, so a dropped camera frame
never stretches a step.
"""

from __future__ import annotations

# 2: the pose and width streams (`streams/`, `meta/*_episode_ends`); data/timestamp is a frame's
# own capture time also with convert.resample_hz.
FORMAT_VERSION = 2

RGB = "data/camera0_rgb"
EEF_POS = "data/robot0_eef_pos"
EEF_ROT = "data/robot0_eef_rot_axis_angle"
GRIPPER_WIDTH = "data/robot0_gripper_width"
TIMESTAMP = "data/timestamp"
EPISODE_ENDS = "meta/episode_ends"
POSE_TIMESTAMP = "streams/pose_timestamp"
POSE_POS = "streams/robot0_eef_pos"
POSE_ROT = "streams/robot0_eef_rot_axis_angle"
WIDTH_TIMESTAMP = "streams/width_timestamp"
WIDTH = "streams/robot0_gripper_width"
POSE_EPISODE_ENDS = "meta/pose_episode_ends"
WIDTH_EPISODE_ENDS = "meta/width_episode_ends"

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
