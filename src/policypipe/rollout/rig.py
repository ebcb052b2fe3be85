"""Closed-loop episodes of the rig's bimanual task: each gripper moves its own block onto its own
mark, side by side on one table (`synthetic.rig`), seen through every wrist camera and the scene
camera, as a robot would see them.

The episode is `episode.run_rig_plan`'s, which also runs the single-gripper task: each gripper is
one `Simulator` of its own block (the grippers never touch: their workspaces lie
`WORKSPACE_SPACING_M` apart), stepped to that gripper's targets of every chunk. The streams run on
their own clocks as a rig recording's (`episode.episode_clocks`): per gripper a camera, pose and
opening clock as a single-gripper episode's, and the scene camera at `SCENE_CAMERA_HZ` with its own
jitter and drops. Every frame is rendered by the renderers that made the rig's recordings: a wrist
view with every block, the scene camera's view with every block and gripper. When asked, the
controller gets what had arrived: camera 0's latest frames that every gripper's pose and opening
streams cover, every other camera's frames up to that time, every gripper's samples. A gripper
whose block is released (its outcome decided) holds still from then on; the episode ends when
every gripper's is, or at the time limit. The episode succeeds when every gripper's does.

Scenes: `plan_rig` seeded with SeedSequence([ROLLOUT_ENTROPY, RIG_SCENES, grippers, seed]), never
a recording's seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policypipe.rollout.episode import (
    RIG_SCENES,
    ROLLOUT_ENTROPY,
    START_NS,
    Controller,
    EpisodeResult,
    RolloutConfig,
    run_rig_plan,
)
from policypipe.rollout.references import TargetChunk
from policypipe.runtime.chunk import ActionChunk, GripperTargets
from policypipe.runtime.observation import Observation
from policypipe.synthetic.rig import RigPlan, plan_rig


def rig_rollout_scene(seed: int, grippers: int) -> RigPlan:
    rng = np.random.default_rng(np.random.SeedSequence([ROLLOUT_ENTROPY, RIG_SCENES, grippers, seed]))
    return plan_rig(rng, START_NS, grippers)


def run_rig_episode(
    controller: Controller,
    seed: int,
    config: RolloutConfig,
    grippers: int = 2,
    scene_camera: bool = True,
    keep_frames: bool = False,
) -> EpisodeResult:
    """One episode in rig scene `seed` of `grippers` (and its scene camera, camera `grippers`). The
    result's `distance_to_mark_m` is the farthest block's, its frames (with `keep_frames`) and final
    frame the scene camera's (camera 0's without one), its missed closes every gripper's."""
    return run_rig_plan(
        controller, seed, rig_rollout_scene(seed, grippers), config, scene_camera, keep_frames
    )


@dataclass
class PerGripper:
    """A rig controller made of one single-gripper reference per gripper (`references`), each given
    camera 0's frame times and its own gripper's samples, their chunks joined on camera 0's clock."""

    controllers: list[Any]  # `references`' controllers, one per gripper

    def act(
        self, observation: Observation, now_ns: int | None = None, episode_start_ns: int | None = None
    ) -> ActionChunk:
        chunks: list[TargetChunk] = []
        for i, controller in enumerate(self.controllers):
            own = Observation({0: observation.cameras[0]}, {0: observation.grippers[i]})
            chunks.append(controller.act(own, now_ns, episode_start_ns))
        first = chunks[0]
        return ActionChunk(
            observation_ns=int(observation.frame_ns[-1]),
            time_ns=first.time_ns,
            grippers={i: GripperTargets(c.position, c.quaternion, c.width) for i, c in enumerate(chunks)},
            execute=first.execute,
            past=np.zeros(len(first.time_ns), bool),
            relative=np.zeros((len(first.time_ns), 10 * len(chunks))),
        )
