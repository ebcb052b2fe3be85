"""Why does the demo policy fail in closed loop: a convention error, or drift? (docs/rollout.md)

Open loop in the simulator: the scene's demonstration drives the simulated gripper, and every 8
steps the runner is asked for a chunk from the simulator's rendered observation; its executed
positions are compared with the demonstration's. An error like eval's says the harness feeds the
policy what training fed it. Closed loop: the policy drives, and the TCP's closest approach to the
block is printed with when it happened. Run after `make demo`, from the repository root:
`python -m tests.benchmarks.measure_rollout_drift [--scenes N]`."""

import argparse
from pathlib import Path

import numpy as np

from policypipe.rollout.episode import RolloutConfig, camera_view, observation_of, rollout_scene, run_episode
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.render import table_texture
from policypipe.synthetic.simulator import NS, Simulator, start_state


class _Tracker:
    """The runner, noting at each request how far the TCP is from the block on the table."""

    def __init__(self, runner, scene, closest: list) -> None:
        self.runner, self.scene, self.closest = runner, scene, closest

    def act(self, observation, episode_start_ns=None):
        offset = observation.position[-1][:2] - self.scene.target_xy
        seconds = (observation.frame_ns[-1] - episode_start_ns) / NS if episode_start_ns else 0.0
        self.closest.append((float(np.linalg.norm(offset)), float(seconds)))
        return self.runner.act(observation, episode_start_ns=episode_start_ns)


parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--scenes", type=int, default=3)
parser.add_argument("--policy", type=Path, default=Path("data/policy"))
args = parser.parse_args()
runner = PolicyRunner.load(args.policy, seed=0)
config = RolloutConfig(frequency_hz=runner.spec.frequency_hz)
period = int(round(NS / config.frequency_hz))

errors = []
for seed in range(args.scenes):
    plan = rollout_scene(seed)
    texture = table_texture(plan.scene)
    t = np.arange(plan.start_ns, plan.end_ns, period, dtype=np.int64)
    position, quaternion = plan.pose_at(t)
    width = plan.width_at(t)
    sim = Simulator(plan.scene, start_state(plan.scene, t[0], position[0], quaternion[0], width[0]))
    history = []
    for i in range(len(t)):
        if i:
            sim.step(t[i], position[i], quaternion[i], width[i])
        s = sim.state
        rgb = camera_view(plan.scene, texture, s, config.camera_size)
        history = [*history[-11:], (t[i], rgb, s.position, s.quaternion, s.width)]
        if i >= 2 and i % 8 == 0 and i + 8 < len(t):
            chunk = runner.act(observation_of(history))
            future, _ = plan.pose_at(chunk.time_ns[:8])
            errors.append(1000 * np.linalg.norm(chunk.position[:8] - future, axis=1).mean())

    closest: list[tuple[float, float]] = []
    result = run_episode(_Tracker(runner, plan.scene, closest), seed, config)
    distance, at_s = min(closest)
    misses = "; ".join(
        ", ".join(f"{name[:-2]} {1000 * margin:+.0f} mm" for name, margin in miss.items())
        for miss in result.missed_closes
    )
    print(
        f"scene {seed}: closed loop {result.outcome}; closest approach to the block {1000 * distance:.0f} mm "
        f"(horizontal) at {at_s:.1f} s" + (f"; missed closes, grip margins: {misses}" if misses else ""),
        flush=True,
    )
print(
    f"open loop in the simulator: executed position error {np.mean(errors):.2f} mm over {len(errors)} chunks"
)
