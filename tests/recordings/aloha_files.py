"""Small ALOHA / RDT HDF5 files written with h5py, in the layout of ACT's `record_episodes.py`:
observations/qpos, observations/images/<camera>, action; images raw, as zero-padded JPEG rows with
compress_len, or as variable-length JPEG byte strings (RDT)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")


def episode_arrays(seed: int, rows: int, size: tuple[int, int] = (40, 32)) -> dict[str, np.ndarray]:
    """qpos (rows, 14): smooth joint motion, the grippers closing; action: the next row's qpos
    (the leader leads); per camera RGB frames with a strong red channel, a green gradient that moves
    with the row and little blue, so a swapped channel order shows."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, rows)[:, None]
    qpos = rng.uniform(-0.5, 0.5, 14) + 0.3 * np.sin(2 * np.pi * t * rng.uniform(0.5, 1.5, 14))
    qpos[:, [6, 13]] = 1.0 - 0.8 * t  # the grippers, normalised 1 (open) .. 0
    action = np.concatenate([qpos[1:], qpos[-1:]])
    w, h = size
    xs = np.arange(w)[None, :].repeat(h, axis=0)
    frames = {}
    for c, camera in enumerate(CAMERAS):
        rgb = np.empty((rows, h, w, 3), np.uint8)
        for step in range(rows):
            rgb[step, ..., 0] = 200 - 20 * c
            rgb[step, ..., 1] = (xs * 4 + 3 * step) % 200
            rgb[step, ..., 2] = 30
        frames[camera] = rgb
    return {"qpos": qpos, "action": action, **frames}


def write_aloha(
    path: Path,
    rows: int,
    seed: int = 0,
    images: str = "raw",
    without: tuple[str, ...] = (),
    joints: int = 14,
) -> dict[str, np.ndarray]:
    """One episode file; `images` "raw", "padded" (ACT's compress option) or "vlen" (RDT's)."""
    import h5py

    arrays = episode_arrays(seed, rows)
    with h5py.File(path, "w") as f:
        f.attrs["sim"] = False
        f.attrs["compress"] = images != "raw"
        f.create_dataset("observations/qpos", data=arrays["qpos"][:, :joints])
        f.create_dataset("observations/qvel", data=np.zeros((rows, joints)))
        f.create_dataset("action", data=arrays["action"][:, :joints])
        cameras = [c for c in CAMERAS if c not in without]
        # ACT encodes the RGB arrays it records with OpenCV, which takes them for BGR.
        encoded = {
            c: [cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 95])[1] for frame in arrays[c]]
            for c in cameras
        }
        if images == "padded":
            padded = max(len(e) for frames in encoded.values() for e in frames)
            f.create_dataset(
                "compress_len", data=np.array([[len(e) for e in encoded[c]] for c in cameras], float)
            )
        for camera in cameras:
            key = f"observations/images/{camera}"
            if images == "raw":
                f.create_dataset(key, data=arrays[camera])
            elif images == "padded":
                rows_ = np.zeros((rows, padded), np.uint8)
                for i, e in enumerate(encoded[camera]):
                    rows_[i, : len(e)] = e
                f.create_dataset(key, data=rows_)
            else:
                data = f.create_dataset(key, (rows,), dtype=h5py.vlen_dtype(np.uint8))
                for i, e in enumerate(encoded[camera]):
                    data[i] = e
    arrays["qpos"], arrays["action"] = arrays["qpos"][:, :joints], arrays["action"][:, :joints]
    return arrays


def convert_aloha(
    root: Path, episodes: int = 6, image_size: tuple[int, int] = (20, 16)
) -> tuple[Path, list[dict]]:
    """`episodes` ALOHA files of 30, 32, ... rows at 50 Hz under root/export, converted with cameras
    0 and 1 to root/d.zarr; the store's path and the arrays each file holds."""
    import json

    from policypipe.dataset.convert import convert_dataset
    from policypipe.dataset.convert_config import ConvertConfig
    from policypipe.recordings.aloha import AlohaConfig
    from policypipe.recordings.pairing import PairConfig, pair_export

    export = root / "export"
    export.mkdir(parents=True)
    written = [write_aloha(export / f"episode_{i}.hdf5", 30 + 2 * i, seed=i) for i in range(episodes)]
    pair = PairConfig(source="aloha", aloha=AlohaConfig(control_hz=50.0))
    (root / "manifest.json").write_text(json.dumps(pair_export(export, pair).manifest()))
    config = ConvertConfig(image_size=image_size, min_frames=8, cameras=(0, 1))
    convert_dataset(root / "manifest.json", export, root / "d.zarr", root / "cache", config)
    return root / "d.zarr", written
