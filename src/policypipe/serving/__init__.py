"""Serving an exported policy to a robot over a websocket: `policypipe serve data/policy` on the
policy's machine, `PolicyClient` on the robot's (docs/serving.md). The client needs NumPy, msgpack
and websockets only, never torch."""
