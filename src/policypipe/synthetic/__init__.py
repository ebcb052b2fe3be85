"""Synthetic data: the sample scene, its demonstrations and an export written from them.

Not production reading code: no stage imports it (`policypipe sample` and the tests do).
`scene` is the table, the target and the camera on the gripper; `render` draws what the camera
sees; `motion` is the demonstrator's ground-truth motion; `recording` writes one recording's
streams as MCAP; `export` writes a whole export folder, with the defects a real export has.
"""
