"""Why does the demo policy fail in closed loop: a convention error, or drift? (docs/rollout.md)

Open loop in the simulator: the scene's demonstration drives the simulated gripper, and every 8
steps the runner is asked for a chunk from the simulator's rendered observation; its executed
positions are compared with the demonstration's. An error like eval's says the harness feeds the
policy what training fed it. Closed loop: the policy drives, and the TCP's closest approach to the
block is printed with when it happened. With `--handover-scenes N`, the demonstration drives each
of N scenes up to a moment of its plan and the policy finishes from there (covariate shift tested
directly). Run after `make demo`, from the repository root:
`python -m tests.benchmarks.measure_rollout_drift [--scenes N] [--handover-scenes N]`."""

import argparse
from pathlib import Path

import numpy as np

from policypipe.rollout.episode import RolloutConfig, camera_view, observation_of, rollout_scene, run_episode
from policypipe.rollout.references import DemonstrationReplay
from policypipe.runtime.runner import PolicyRunner
from policypipe.synthetic.render import table_texture
from policypipe.synthetic.simulator import NS, Simulator, start_state


class _Tracker:
    """The runner, noting at each request how far the TCP is from the block on the table."""

    def __init__(self, runner, scene, closest: list) -> None:
        self.runner, self.scene, self.closest = runner, scene, closest

    def act(self, observation, now_ns=None, episode_start_ns=None):
        offset = observation.position[-1][:2] - self.scene.target_xy
        seconds = (observation.frame_ns[-1] - episode_start_ns) / NS if episode_start_ns else 0.0
        self.closest.append((float(np.linalg.norm(offset)), float(seconds)))
        return self.runner.act(observation, now_ns=now_ns, episode_start_ns=episode_start_ns)


class _Handover:
    """The scene's demonstration drives until `at_ns`, the policy from then on: covariate shift
    tested directly. If the policy finishes from a state on the demonstrations' path but not from
    its own, what breaks it is where its own errors take it."""

    def __init__(self, runner, plan, at_ns: int, frequency_hz: float) -> None:
        self.runner, self.at_ns = runner, at_ns
        self.demonstration = DemonstrationReplay(plan, frequency_hz)

    def act(self, observation, now_ns=None, episode_start_ns=None):
        if now_ns < self.at_ns:
            return self.demonstration.act(observation, now_ns)
        return self.runner.act(observation, now_ns=now_ns, episode_start_ns=episode_start_ns)


# Knots of `plan_motion`'s plain plan where the policy takes over.
HANDOVERS = {
    "start": 0,
    "halfway to the block": 1.5,
    "above the block": 2,
    "block grasped": 5,
    "over the mark": 7,
}


parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--scenes", type=int, default=3)
parser.add_argument("--policy", type=Path, default=Path("data/policy"))
parser.add_argument("--handover-scenes", type=int, default=0, help="scenes for the handover measurement")
# Scenes of the choice range (bench_rollout_success): the rollout stage reports on 0-49.
parser.add_argument("--first-scene", type=int, default=1000)
args = parser.parse_args()
runner = PolicyRunner.load(args.policy, seed=0)
config = RolloutConfig(frequency_hz=runner.spec.frequency_hz)
period = int(round(NS / config.frequency_hz))

errors = []
for seed in range(args.first_scene, args.first_scene + args.scenes):
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

for name, knot in HANDOVERS.items():
    if not args.handover_scenes:
        break
    outcomes: dict[str, int] = {}
    for seed in range(args.first_scene, args.first_scene + args.handover_scenes):
        plan = rollout_scene(seed)
        at_s = float(np.interp(knot, np.arange(len(plan.knot_s)), plan.knot_s))
        runner.generator.manual_seed(seed)
        handover = _Handover(runner, plan, plan.start_ns + int(at_s * NS), config.frequency_hz)
        outcome = run_episode(handover, seed, config).outcome
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"policy from '{name}': {outcomes}", flush=True)
