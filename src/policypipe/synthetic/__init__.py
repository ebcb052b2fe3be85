"""Synthetic data: the sample scene, its demonstrations and an export written from them.

Not production reading code: no reader of an export imports it. `policypipe sample` and the tests
write exports with it, the `rollout` stage simulates its scene, and `train` reads a sample export's
ground truth back for the privileged control alone (`train.privileged`).
`scene` is the table, the target and the camera on the gripper; `render` draws what the camera
sees; `motion` is the demonstrator's ground-truth motion; `ground_truth` each recording's draws and
plan; `recording` writes one recording's streams as MCAP; `export` writes a whole export folder,
with the defects a real export has; `simulator` runs the scene in closed loop; `privileged` is the
control's observation, the scene's state.
"""
