"""Synthetic data: the sample scene, its demonstrations and an export written from them.

Not production reading code: no stage imports it (`policypipe sample` and the tests do).
`scene` is the table, the target and the wrist-camera renderer; `motion` the demonstrator's
ground-truth motion; `recording` one recording's streams written as MCAP; `export` a whole
export folder, with the defects a real export has.
"""
