"""Serving benchmark (`make bench`): `act` latency (p50, p99) for a policy of the demo's size on this
machine's CPU, in process and through `policypipe serve`'s server on loopback, and what the server
adds to each call (its round trip less its own act time).

The policy is an untrained DiffusionPolicy of the demo config (params.yaml: train.model and the
policy windows), with its normalizers fitted from data/stats/stats.json where the pipeline has made
it and from fixed ranges otherwise: the weights' values do not change the arithmetic's cost. Its
runtime spec is built here (30 Hz, the sample camera's rate), as no trained demo policy is needed.
The observation is what a robot on the sample task sends: the last 0.2 s of 320x240 frames (6),
poses at 150 Hz and widths at 45 Hz, up to just after the latest frame.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from policypipe.config import read_section
from policypipe.dataset import events
from policypipe.dataset.windows import POSE_DIM
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from policypipe.runtime.observation import Observation
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import RuntimeSpec
from policypipe.serving.client import PolicyClient
from policypipe.serving.metadata import policy_metadata
from policypipe.serving.protocol import act_message, pack
from policypipe.serving.server import DEFAULT_MAX_REQUEST_BYTES, PolicyServer, ServerThread
from policypipe.training.config import train_config_from_params

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
GOAL_MS = 5.0


def demo_policy(folder: Path) -> tuple[Path, str]:
    params = REPO / "params.yaml"
    config = train_config_from_params(read_section(params, "train"), read_section(params, "policy")).model
    stats_path = REPO / "data/stats/stats.json"
    if stats_path.is_file():
        stats, source = json.loads(stats_path.read_text()), "normalizers from data/stats/stats.json"
    else:
        stats, source = fixed_stats(config.horizon), "normalizers from fixed ranges (no stats.json)"
    torch.manual_seed(0)
    policy = DiffusionPolicy(config)
    policy.fit_normalizers(stats)
    spec = RuntimeSpec(
        frequency_hz=30.0,
        image_size=config.image_size,
        jpeg_quality=95,
        camera_topics=("/camera0/image",),
        n_obs_steps=config.n_obs_steps,
        horizon=config.horizon,
        n_action_steps=config.n_action_steps,
        width_ranges_m=((0.0, 0.09),),
        dataset_fingerprint="bench",
        stats_sha256="bench",
        grippers=(0,),
        cameras=(0,),
        max_camera_offset_ms=40.0,
    )
    save_policy(folder, policy, {"bench": True}, spec.to_json())
    return folder, source


def fixed_stats(horizon: int) -> dict:
    def entry(dim: int, low: float, high: float) -> dict:
        middle = (low + high) / 2
        return {"min": [low] * dim, "max": [high] * dim, "mean": [middle] * dim, "std": [0.05] * dim}

    return {
        "lowdim": {
            "obs.eef_pose_rel": entry(9, -1.0, 1.0),
            "obs.gripper_width": entry(1, 0.0, 0.09),
            "action": entry(10, -1.0, 1.0),
            "action_per_step": entry(horizon * 10, -1.0, 1.0),
        },
        "image": {"camera0_rgb": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}},
        # The event head's label statistics (the demo's params train one; inference never runs it).
        "events": {"labels": {name: entry(POSE_DIM, -0.3, 0.3) for name in events.STATS_ENTRIES.values()}},
    }


def robot_observation(t_ns: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def times(hz: float) -> np.ndarray:  # the last 0.2 s, and one sample at or after t
        return t_ns + np.round(np.arange(-int(0.2 * hz), 2) * NS / hz).astype(np.int64)

    frame_ns = t_ns + np.round(np.arange(-5, 1) * NS / 30).astype(np.int64)
    pose_ns, width_ns = times(150), times(45)
    s = (pose_ns - t_ns) / NS
    return {
        "frame_ns": frame_ns,
        "frames": rng.integers(0, 256, (len(frame_ns), 240, 320, 3), dtype=np.uint8),
        "pose_ns": pose_ns,
        "position": np.stack([0.3 + 0.1 * s, 0.05 * s, 0.2 + 0.0 * s], axis=1),
        "quaternion": Rotation.from_rotvec(np.outer(s, [0.0, 0.0, 0.5])).as_quat(),
        "width_ns": width_ns,
        "width": 0.05 + 0.01 * (width_ns - t_ns) / NS,
    }


def percentiles(values_ms: list[float]) -> str:
    p50, p99 = np.percentile(values_ms, [50, 99])
    return f"p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100, help="calls per path, after 5 of warm-up")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    observation = robot_observation(10 * NS, rng)
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-serve-") as tmp:
        folder, source = demo_policy(Path(tmp) / "policy")
        runner = PolicyRunner.load(folder)
        metadata = policy_metadata(folder, runner.spec.to_json(), DEFAULT_MAX_REQUEST_BYTES)
        in_process, served, added, infer = [], [], [], []
        with ServerThread(PolicyServer(runner, metadata)) as running, PolicyClient(running.url) as client:
            # In process and served calls alternate, so that the machine's other load falls on both.
            for i in range(5 + args.calls):
                t0 = time.perf_counter()
                runner.act(Observation.checked(**observation), seed=i)
                t1 = time.perf_counter()
                chunk = client.act(observation, seed=i)
                t2 = time.perf_counter()
                if i >= 5:
                    in_process.append((t1 - t0) * 1e3)
                    served.append((t2 - t1) * 1e3)
                    infer.append(chunk.infer_ms)
                    added.append((t2 - t1) * 1e3 - chunk.infer_ms)
    request_mb = len(pack(act_message(observation, seed=0))) / 2**20
    params = sum(p.numel() for p in runner.policy.parameters())
    print(
        f"serving, demo config (params.yaml), untrained, {source}; {params:,} parameters, "
        f"{runner.policy.config.num_inference_steps} DDIM steps, {torch.get_num_threads()} torch threads; "
        f"requests of {request_mb:.2f} MiB (6 frames of 320x240), {args.calls} calls each"
    )
    print(f"  act in process                {percentiles(in_process)}")
    print(f"  act through the server        {percentiles(served)}")
    print(f"    of which the server's act   {percentiles(infer)}")
    print(f"  added by the server           {percentiles(added)}   (goal: p50 under {GOAL_MS:.0f} ms)")
    ratio = np.median(served) / np.median(in_process)
    print(f"  served / in process, p50      {ratio:7.3f}")
    p50_added = float(np.median(added))
    print(f"  goal {'met' if p50_added < GOAL_MS else 'NOT met'}: the server adds {p50_added:.2f} ms at p50")


if __name__ == "__main__":
    main()
