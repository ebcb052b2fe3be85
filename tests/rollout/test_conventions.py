"""Closed loop catches what offline error cannot: a chunk composed in the wrong frame.

`DemonstrationAsPolicy` is a runner whose "policy" outputs what a perfect one would: the scene's
demonstration over the horizon, relative to the pose at t, as training's targets are. The runner
composes it onto the pose at t (the code a robot runs). `ComposedInTheWorldFrame` outputs the same
relative chunks, so every offline number is the same, but adds the position deltas in the world
frame instead of the gripper's and applies the rotation on the wrong side: the convention error a
hand-written robot-side loop makes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from scipy.spatial.transform import Rotation

from policypipe.dataset.windows import relative_poses, rot6d_to_matrix
from policypipe.rollout.episode import RolloutConfig, rollout_scene, run_episode
from policypipe.runtime.chunk import ActionChunk, GripperTargets
from policypipe.runtime.runner import PolicyRunner
from tests.runtime.test_runner import pipeline  # noqa: F401 (a fixture)

SEEDS = range(4)


class DemonstrationAsPolicy(PolicyRunner):
    """The runner, with the scene's demonstration as its policy's relative output."""

    def __init__(self, runner: PolicyRunner, seed: int) -> None:
        super().__init__(runner.policy, runner.spec)
        self.plan = rollout_scene(seed)
        self.chunks: list[np.ndarray] = []

    def act(self, observation, now_ns=None, seed=None, episode_start_ns=None) -> ActionChunk:
        _, t, anchors = self.prepare(observation, episode_start_ns)
        p_t, r_t, w_t = anchors[0].position, anchors[0].rotation, anchors[0].width
        times = t + self.action_offsets_ns
        position, quaternion = self.plan.pose_at(times)
        rotation = Rotation.from_quat(quaternion).as_matrix()
        pose = relative_poses(p_t[None], r_t[None], position[None], rotation[None])[0]
        relative = np.concatenate([pose, (self.plan.width_at(times) - w_t)[:, None]], axis=1)
        self.chunks.append(relative)
        return self.compose(relative, t, anchors, now_ns)


class ComposedInTheWorldFrame(DemonstrationAsPolicy):
    """The same relative chunks, composed as if the deltas were in the world frame."""

    def compose(self, relative, t, anchors, now_ns) -> ActionChunk:
        right = super().compose(relative, t, anchors, now_ns)
        p_t, r_t = anchors[0].position, anchors[0].rotation
        position = p_t + relative[:, :3]
        rotation = rot6d_to_matrix(relative[:, 3:9]) @ r_t
        quaternion = Rotation.from_matrix(rotation).as_quat()
        wrong = GripperTargets(position, quaternion, right.width)
        return dataclasses.replace(right, grippers={0: wrong})


def test_a_chunk_composed_in_the_wrong_frame_fails_in_closed_loop_with_the_same_offline_output(
    pipeline,  # noqa: F811
) -> None:
    runner = PolicyRunner.load(pipeline.policy)
    config = RolloutConfig(frequency_hz=runner.spec.frequency_hz, camera_size=(160, 120))
    right = {seed: DemonstrationAsPolicy(runner, seed) for seed in SEEDS}
    wrong = {seed: ComposedInTheWorldFrame(runner, seed) for seed in SEEDS}
    outcomes = {
        name: Counter(run_episode(doubles[s], s, config).outcome for s in SEEDS)
        for name, doubles in (("right", right), ("wrong", wrong))
    }
    assert outcomes["right"] == {"success": len(SEEDS)}
    assert outcomes["wrong"]["success"] == 0
    # What an offline evaluation sees, the policy's relative output from the same observation, is
    # the same for both: the first chunk of every episode (before the paths part) is identical.
    for seed in SEEDS:
        assert np.array_equal(right[seed].chunks[0], wrong[seed].chunks[0])
