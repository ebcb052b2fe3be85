"""The runtime monitor's cost (`make bench`): a chunk's `act` with the monitor against the same runner
without it, alternating, on a policy of the demo's size (bench_serve's: the demo config, untrained;
the weights' values do not change the cost) with a bank of the params' bank_size embeddings; and the
monitor's own reading alone. Goal: at most 10 % added to a chunk's inference (issue 53).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from policypipe.config import from_mapping, read_section
from policypipe.monitor.calibration import MonitorConfig
from policypipe.monitor.scores import Calibration, EmbeddingBank, Monitor
from policypipe.runtime.observation import Observation
from policypipe.runtime.runner import PolicyRunner
from tests.benchmarks.bench_serve import NS, REPO, demo_policy, percentiles, robot_observation

GOAL = 1.10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=60, help="calls per path, after 5 of warm-up")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = from_mapping(MonitorConfig, read_section(REPO / "params.yaml", "monitor"), "monitor")
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-monitor-") as tmp:
        folder, source = demo_policy(Path(tmp) / "policy")
        plain, watched = PolicyRunner.load(folder), PolicyRunner.load(folder)
    dim = watched.policy.condition(_batch(watched)).shape[1]
    bank = EmbeddingBank.of(np.random.default_rng(0).normal(size=(config.bank_size, dim)), config.neighbours)
    calibration = Calibration(
        bank, 1.0, 1.0, 1.0, config.persist, config.false_alarm_rate, config.alarm_scores
    )
    watched.monitor = Monitor(calibration, watched.policy.normalize_actions)
    period = round(NS / watched.spec.frequency_hz) * watched.spec.n_action_steps
    rng = np.random.default_rng(1)
    without, with_monitor, reading = [], [], []
    for i in range(5 + args.calls):  # alternating, so that the machine's other load falls on both
        observation = Observation.checked(**robot_observation(10 * NS + i * period, rng))
        t0 = time.perf_counter()
        plain.act(observation, seed=i, episode_start_ns=10 * NS)
        t1 = time.perf_counter()
        chunk = watched.act(observation, seed=i, episode_start_ns=10 * NS)
        t2 = time.perf_counter()
        # The reading alone, again on the same chunk (its own previous: the cost, not the value).
        batch = watched.prepare(observation, 10 * NS)[0]
        condition = watched.policy.condition(batch).detach().numpy()
        t3 = time.perf_counter()
        watched.monitor.read(condition, chunk, 10 * NS)
        t4 = time.perf_counter()
        if i >= 5:
            without.append((t1 - t0) * 1e3)
            with_monitor.append((t2 - t1) * 1e3)
            reading.append((t4 - t3) * 1e3)
    print(
        f"monitor, demo config (params.yaml), untrained, {source}; bank of {config.bank_size} embeddings of "
        f"{dim} numbers, k = {config.neighbours}; {torch.get_num_threads()} torch threads, {args.calls} calls"
    )
    print(f"  act without the monitor   {percentiles(without)}")
    print(f"  act with the monitor      {percentiles(with_monitor)}")
    print(f"  the monitor's reading     {percentiles(reading)}")
    ratio = float(np.median(with_monitor) / np.median(without))
    share = float(np.median(reading) / np.median(without))
    print(f"  with / without, p50       {ratio:7.3f}")
    print(f"  reading / act, p50        {share:7.3f}")
    print(
        f"  goal {'met' if share <= GOAL - 1 else 'NOT met'}: the monitor adds {share:.1%} to a chunk's act"
    )


def _batch(runner: PolicyRunner) -> dict[str, torch.Tensor]:
    observation = Observation.checked(**robot_observation(10 * NS, np.random.default_rng(0)))
    return runner.prepare(observation, 10 * NS)[0]


if __name__ == "__main__":
    main()
