"""The LeRobot export loaded by the real `lerobot` package, outside this project's environment
(`make check-lerobot`; lerobot 0.5 and later need Python 3.12 and a torch older than this project's).

Two steps, in two environments:
- `python tests/interop/check_with_lerobot.py write OUT` (the project's): exports a small sample
  dataset (gripper poses, on a 30 Hz grid) and a small ALOHA import (joint space, 50 Hz) to
  OUT/pose and OUT/joint;
- `python tests/interop/check_with_lerobot.py load OUT` (one with lerobot): opens each with
  `LeRobotDataset(repo_id, root=...)`, offline, and compares every frame it returns with the
  export's own parquet rows (state, action, frame index: exactly; the task string) and its videos
  decoded with PyAV.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TASKS = {"pose": "pick the block and place it on the mark", "joint": "fold the towel"}


def write(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from policypipe.dataset.convert_config import ConvertConfig
    from policypipe.interop.lerobot import LeRobotExportConfig, export_lerobot
    from policypipe.synthetic.export import SampleConfig, write_sample_export
    from tests.dataset.test_convert import convert
    from tests.recordings.aloha_files import convert_aloha

    export = write_sample_export(out / "sources/raw", SampleConfig(recordings=4, seed=11, defects=False)).root
    convert(
        export, out / "sources/pose.zarr", ConvertConfig(image_size=(64, 48), min_frames=10, resample_hz=30.0)
    )
    joint, _ = convert_aloha(out / "sources/aloha", episodes=6)
    for name, store in (("pose", out / "sources/pose.zarr"), ("joint", joint)):
        summary = export_lerobot(store, out / name, LeRobotExportConfig(task=TASKS[name]))
        print(f"wrote {summary.out}: {summary.episodes} episodes, {summary.frames} frames")


def load(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import av
    import lerobot
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    for name, task in TASKS.items():
        root = out / name
        dataset = LeRobotDataset(f"policypipe/{name}", root=root)
        info = json.loads((root / "meta/info.json").read_text())
        data = pq.read_table(root / "data/chunk-000/file-000.parquet")
        state = np.stack(data["observation.state"].to_numpy(zero_copy_only=False))
        action = np.stack(data["action"].to_numpy(zero_copy_only=False))
        assert dataset.num_episodes == info["total_episodes"] and len(dataset) == info["total_frames"] == len(
            state
        )
        decoded = {}
        for key in dataset.meta.video_keys:
            with av.open(str(root / f"videos/{key}/chunk-000/file-000.mp4")) as container:
                decoded[key] = [
                    f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])
                ]
        worst = dict.fromkeys(decoded, 0.0)
        for i in range(len(dataset)):
            item = dataset[i]
            assert torch.equal(item["observation.state"], torch.from_numpy(state[i])), (name, i)
            assert torch.equal(item["action"], torch.from_numpy(action[i])), (name, i)
            assert item["task"] == task and int(item["frame_index"]) == data["frame_index"][i].as_py()
            for key, frames in decoded.items():
                frame = (item[key].permute(1, 2, 0).numpy() * 255).round().astype(int)  # (C, H, W) in [0, 1]
                worst[key] = max(worst[key], float(np.abs(frame - frames[i].astype(int)).mean()))
        print(
            f"lerobot {lerobot.__version__} ({dataset._video_backend}) loaded {root}: {dataset.num_episodes} "
            f"episodes, {len(dataset)} frames at {dataset.fps} fps; state, action, task and frame index "
            "exact at every frame; frames against PyAV's decode, worst mean difference (of 255): "
            + ", ".join(f"{k} {v:.3f}" for k, v in worst.items())
        )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "load"):
        sys.exit(f"usage: {sys.argv[0]} write|load OUT")
    (write if sys.argv[1] == "write" else load)(Path(sys.argv[2]))
