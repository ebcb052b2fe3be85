"""The example robot loop, driven against the server in process by a robot that replays a recording,
and the lines docs/serving.md shows of it."""

from __future__ import annotations

import inspect
import re
import time

import numpy as np
import pytest

from policypipe.serving import robot_loop
from policypipe.serving.client import PolicyClient
from policypipe.serving.robot_loop import run_episode
from tests.conftest import REPO_ROOT
from tests.serving.conftest import serving
from tests.serving.test_server import small


class ReplayRobot:
    """A robot whose camera, pose and width streams are a recorded observation moved to the present
    (the same geometry, later times), on a clock that skips its sleeps: seconds of episode in
    milliseconds."""

    def __init__(self, observation: dict) -> None:
        self.recorded = observation
        self.skipped_ns = 0
        self.targets: list[tuple[int, np.ndarray, np.ndarray, float]] = []
        self.held = False

    def now_ns(self) -> int:
        return time.time_ns() + self.skipped_ns

    def observation(self) -> dict:
        shift = self.now_ns() - int(self.recorded["frame_ns"][-1])  # the latest frame: just captured
        return {k: v + shift if k.endswith("_ns") else v for k, v in self.recorded.items()}

    def move_to(self, time_ns, position, quaternion, width) -> None:
        self.targets.append((time_ns, position, quaternion, width))

    def sleep_until(self, time_ns: int) -> None:
        self.skipped_ns += max(0, time_ns - self.now_ns())

    def hold(self) -> None:
        self.held = True


def test_the_example_loop_executes_every_chunk_on_time_and_logs_the_policy(
    runner, observation, pipeline
) -> None:
    robot = ReplayRobot(small(observation))
    with serving(runner, pipeline.policy) as running, PolicyClient(running.url) as client:
        result = run_episode(client, robot, duration_s=2.0)
        assert result["policy"]["weights_sha256"] == client.metadata["policy"]["weights_sha256"]
    times = np.array([t for t, *_ in robot.targets])
    step_ns = 1e9 / runner.spec.frequency_hz
    # 2 s at the policy's rate, a chunk's n_action_steps at a time, none in the past or twice.
    spec = runner.spec
    assert result["steps_executed"] == len(times) >= 2.0 * spec.frequency_hz - spec.n_action_steps
    assert (np.diff(times) > 0).all() and np.median(np.diff(times)) == pytest.approx(step_ns, rel=0.01)
    assert not robot.held


def test_the_robot_is_held_when_the_server_goes_away(runner, observation, pipeline) -> None:
    robot = ReplayRobot(small(observation))
    with serving(runner, pipeline.policy) as running, PolicyClient(running.url) as client:
        running.stop()
        with pytest.raises(Exception, match="1001"):
            run_episode(client, robot, duration_s=1.0)
    assert robot.held


def test_the_docs_show_the_example_loop_line_for_line() -> None:
    docs = (REPO_ROOT / "docs/serving.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, re.DOTALL)
    assert inspect.getsource(robot_loop) in blocks
