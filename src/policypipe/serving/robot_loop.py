"""A robot's control loop against `policypipe serve`: the example of docs/serving.md, "A robot loop".

Each cycle sends the latest observation, executes the steps of the chunk marked `execute` at their
times, and asks again one round trip before the last of them is due, so that the next chunk arrives
as the robot runs out of targets. Any failure of the server holds the robot still.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from policypipe.serving.client import PolicyClient

logger = logging.getLogger(__name__)


class Robot(Protocol):
    """Your robot's drivers, on one clock (its capture times, its targets' times, now_ns)."""

    def now_ns(self) -> int: ...

    def observation(self) -> dict[str, np.ndarray]:
        """The last 0.2 s or so of camera frames (RGB, with their capture times), gripper poses
        and openings, up to one sample at or after the latest frame (Observation.checked's
        fields: camera k >= 1 and gripper i >= 1 as camera{k}_frames, robot{i}_position, ...)."""

    def move_to(
        self, time_ns: int, position: np.ndarray, quaternion: np.ndarray, width: float, **gripper: int
    ) -> None:
        """Queue a target for its time: the controller reaches it then. A policy of several
        grippers passes `gripper=i` (the gripper's number) with each target; a one-gripper
        policy's targets come without it."""

    def sleep_until(self, time_ns: int) -> None: ...

    def hold(self) -> None:
        """Stop where it is."""


def run_episode(client: PolicyClient, robot: Robot, duration_s: float) -> dict[str, Any]:
    """Runs the policy on the robot for `duration_s`; returns what the episode log needs."""
    identity = client.metadata["policy"]
    logger.info("policy %s, lineage %s", identity["weights_sha256"], identity["lineage"])
    end_ns = robot.now_ns() + round(duration_s * 1e9)
    round_trip_ns, episode_start_ns, executed = 0, None, 0
    try:
        while robot.now_ns() < end_ns:
            observation = robot.observation()
            if episode_start_ns is None:  # the first calls act on less history, as training did
                episode_start_ns = int(observation["frame_ns"][-1])
            sent_ns = robot.now_ns()
            # now_ns: when the targets can reach the robot; the steps already past are not executed.
            chunk = client.act(observation, now_ns=sent_ns + round_trip_ns, episode_start_ns=episode_start_ns)
            round_trip_ns = robot.now_ns() - sent_ns
            steps = np.flatnonzero(chunk.execute)
            if len(steps) == 0:
                logger.warning("a chunk arrived after all its steps were due (%d ms)", round_trip_ns // 10**6)
                continue
            for k in steps:
                for i, targets in chunk.grippers.items():
                    target = targets.position[k], targets.quaternion[k], float(targets.width[k])
                    robot.move_to(
                        int(chunk.time_ns[k]), *target, **({"gripper": i} if len(chunk.grippers) > 1 else {})
                    )
            executed += len(steps)
            robot.sleep_until(int(chunk.time_ns[steps[-1]]) - round_trip_ns)
    except BaseException:
        robot.hold()  # the server went away, timed out, refused the observation, or Ctrl-C
        raise
    return {"policy": identity, "episode_start_ns": episode_start_ns, "steps_executed": executed}
