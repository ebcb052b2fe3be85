"""Does the JPEG round trip of the runner's frames matter? The demo's policy on its validation
episodes, fed the raw recordings: chunks with and without it, same noise, and both against the
recorded future (docs/runtime.md). Run after `make demo`, from the repository root:
`python -m tests.benchmarks.measure_jpeg_round_trip`."""

import json
from pathlib import Path

import numpy as np
import zarr

from policypipe.dataset import layout
from policypipe.dataset.episode import resize_frame
from policypipe.dataset.windows import WindowConfig
from policypipe.evaluation.samples import collect_samples
from policypipe.lineage.hashing import sha256_file
from policypipe.policy.export import load_policy
from policypipe.runtime.runner import PolicyRunner
from policypipe.runtime.spec import spec_of_training
from tests.runtime.test_runner import Pipeline, anchor_capture_ns, episode_start_ns, robot_observation

root = Path.cwd()
store, stats_path = root / "data/dataset.zarr", root / "data/stats/stats.json"
stats = json.loads(stats_path.read_text())
attrs = dict(zarr.open_group(store, mode="r").attrs)
spec = spec_of_training(attrs, stats, sha256_file(stats_path))
manifest = json.loads((root / "data/manifest.json").read_text())
vio = {r["stem"]: root / "data/raw" / r["files"]["vio"]["path"] for r in manifest["recordings"]}
recordings = {i: vio[ep["stem"]] for i, ep in enumerate(attrs[layout.ATTRS_EPISODES])}
pipe = Pipeline(store, root / "data/policy", stats, recordings)
with_jpeg = PolicyRunner(load_policy(root / "data/policy"), spec)
without = PolicyRunner(load_policy(root / "data/policy"), spec)
without._training_frame = lambda frame: resize_frame(frame, spec.image_size)
window = WindowConfig(**stats["window"])
samples = collect_samples(store, stats["split"]["val"], window, stride=8)
n = window.n_action_steps
diff, err_with, err_without, pixel = [], [], [], []
for i, (e, a) in enumerate(zip(samples.episodes, samples.anchors)):
    t = anchor_capture_ns(pipe, int(e), int(a))
    obs = robot_observation(recordings[int(e)], t)
    start = episode_start_ns(pipe, int(e))
    b1, _, _ = with_jpeg.prepare(obs, start)
    b2, _, _ = without.prepare(obs, start)
    pixel.append(np.abs(b1["obs_images"].numpy().astype(int) - b2["obs_images"].numpy().astype(int)).mean())
    c1 = with_jpeg.act(obs, seed=i, episode_start_ns=start)
    c2 = without.act(obs, seed=i, episode_start_ns=start)
    rec = samples.batch["action"][i, :n, :3].double().numpy()
    diff.append(1e3 * np.linalg.norm(c1.relative[:n, :3] - c2.relative[:n, :3], axis=1).mean())
    err_with.append(1e3 * np.linalg.norm(c1.relative[:n, :3] - rec, axis=1).mean())
    err_without.append(1e3 * np.linalg.norm(c2.relative[:n, :3] - rec, axis=1).mean())
print(f"{len(diff)} samples; mean |pixel difference| {np.mean(pixel):.2f} of 255")
print(
    "executed-step position, with vs without the JPEG round trip: "
    f"mean {np.mean(diff):.3f} mm, max {np.max(diff):.3f} mm"
)
print(f"error vs recorded: with {np.mean(err_with):.3f} mm, without {np.mean(err_without):.3f} mm")
