"""robomimic HDF5 import benchmark: ratios against a bare h5py loop measured in the same run.

A file of `--demos` demos of `--rows` rows with two 84 x 84 cameras (robomimic's image size) is
written once. Then, each timed alone:
- bare h5py: every demo's pose, quaternion, finger joints and both cameras' frames read into NumPy
  (what any importer must do at least);
- bare h5py + resize + JPEG: the same, and every frame resized to the dataset's size and encoded
  (what the dataset stores), one process;
- the import: `pair` (the inventory and the file's SHA-256) and `convert` (one worker and all
  cores) into a zarr store from an empty cache.
Printed: frames/s of each, and the import's ratio to each bare loop.

    python -m tests.benchmarks.bench_import_hdf5 [--demos 50] [--rows 200]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import resize_frame
from policypipe.dataset.image_codec import encode_jpeg
from policypipe.recordings.hdf5 import RobomimicConfig
from policypipe.recordings.pairing import PairConfig, pair_export
from tests.recordings.robomimic_files import CAMERAS, demo_arrays


def write_file(path: Path, demos: int, rows: int) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "env_kwargs": {"control_freq": 20}})
        for n in range(demos):
            for key, values in demo_arrays(n, rows, image_size=84).items():
                data.create_dataset(f"demo_{n}/obs/{key}", data=values)


def bare_read(path: Path, encode: ConvertConfig | None) -> int:
    import h5py

    frames = 0
    with h5py.File(path, "r") as f:
        for name in f["data"]:
            obs = f["data"][name]["obs"]
            for key in ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"):
                np.asarray(obs[key][()])
            for camera in CAMERAS:
                images = obs[camera][()]
                frames += len(images) if camera == CAMERAS[0] else 0
                if encode is not None:
                    for image in images:
                        encode_jpeg(resize_frame(image, encode.image_size), encode.jpeg_quality)
    return frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--demos", type=int, default=50)
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    config = ConvertConfig(cameras=(0, 1), image_size=(84, 84))
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export"
        export.mkdir()
        write_file(export / "lift.hdf5", args.demos, args.rows)
        size_mb = (export / "lift.hdf5").stat().st_size / 1e6
        frames = args.demos * args.rows
        print(f"{args.demos} demos x {args.rows} rows, 2 cameras at 84 x 84: {size_mb:.0f} MB, {frames} rows")

        timed = {}
        started = time.perf_counter()
        bare_read(export / "lift.hdf5", None)
        timed["bare h5py read"] = time.perf_counter() - started
        started = time.perf_counter()
        bare_read(export / "lift.hdf5", config)
        timed["bare h5py read + resize + JPEG"] = time.perf_counter() - started

        pair = PairConfig(source="robomimic", robomimic=RobomimicConfig(cameras=CAMERAS))
        for workers in (1, os.cpu_count() or 1):
            out = Path(tmp) / f"run{workers}"
            out.mkdir()
            started = time.perf_counter()
            manifest = pair_export(export, pair).manifest()
            (out / "manifest.json").write_text(json.dumps(manifest))
            result = convert_dataset(
                out / "manifest.json",
                export,
                out / "dataset.zarr",
                out / "cache",
                replace(config, workers=workers),
            )
            assert result.frames == frames and not result.excluded
            timed[f"import (pair + convert, {workers} worker{'s' if workers > 1 else ''})"] = (
                time.perf_counter() - started
            )
    for name, seconds in timed.items():
        print(f"{name:45s} {seconds:6.2f} s  {frames / seconds:8.0f} rows/s")
    for name, seconds in timed.items():
        if name.startswith("import"):
            print(
                f"{name}: {timed['bare h5py read'] / seconds:.2f} x the bare read's speed, "
                f"{timed['bare h5py read + resize + JPEG'] / seconds:.2f} x the bare read + resize + JPEG's"
            )


if __name__ == "__main__":
    main()
