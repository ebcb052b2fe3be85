"""Small robomimic / MimicGen HDF5 files written with h5py, in the layout robomimic's dataset
docs give: data/demo_N/obs/<key> rows, data.attrs["env_args"] JSON, mask/<filter> lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


def demo_arrays(seed: int, rows: int, image_size: int = 32) -> dict[str, np.ndarray]:
    """One demo's obs: a smooth reach, a turning wrist, fingers that close, and two cameras whose
    frames are smooth gradients (JPEG keeps them within a few levels) shifted with the step."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, rows)[:, None]
    position = rng.uniform(-0.2, 0.2, 3) + t * rng.uniform(-0.1, 0.1, 3) + np.array([0.5, 0.0, 1.0])
    yaw = 0.3 * np.sin(3.0 * t[:, 0] + seed)
    rotation = Rotation.from_euler("xz", np.stack([np.full(rows, np.pi), yaw], axis=1))
    finger = 0.04 - 0.03 * np.clip((t[:, 0] - 0.4) * 4.0, 0.0, 1.0)  # each finger from the centre
    qpos = np.stack([finger, -finger], axis=1)
    ys, xs = np.mgrid[0:image_size, 0:image_size]
    frames = []
    for step in range(rows):
        red = (xs * 4 + step) % 256
        green = (ys * 4 + 2 * step) % 256
        blue = np.full_like(xs, (40 + 3 * seed) % 256)
        frames.append(np.stack([red, green, blue], axis=-1).astype(np.uint8))
    images = np.stack(frames)
    return {
        "robot0_eef_pos": position,
        "robot0_eef_quat": rotation.as_quat(),  # x, y, z, w: robosuite's order
        "robot0_gripper_qpos": qpos,
        CAMERAS[0]: images,
        CAMERAS[1]: images[:, ::-1].copy(),
    }


def write_robomimic(
    path: Path,
    demos: dict[int, int],
    control_freq: float | None = 20,
    masks: dict[str, list[int]] | None = None,
    without: dict[int, tuple[str, ...]] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """A file of `demos` {N: rows} (data/demo_N); `without` {N: obs keys} leaves keys out of a demo.
    Returns {"data/demo_N": its obs arrays}."""
    import h5py

    written = {}
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        env_kwargs = {"robots": ["Panda"], "has_offscreen_renderer": True}
        if control_freq is not None:
            env_kwargs["control_freq"] = control_freq
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1, "env_kwargs": env_kwargs})
        for number, rows in demos.items():
            demo = data.create_group(f"demo_{number}")
            demo.attrs["num_samples"] = rows
            arrays = demo_arrays(number, rows)
            for key in (without or {}).get(number, ()):
                arrays.pop(key)
            for key, values in arrays.items():
                demo.create_dataset(f"obs/{key}", data=values)
            # Delta OSC commands, as robomimic's `actions` usually are: never read.
            demo.create_dataset("actions", data=np.zeros((rows, 7)))
            written[f"data/demo_{number}"] = arrays
        for name, numbers in (masks or {}).items():
            f.create_dataset(f"mask/{name}", data=np.array([f"demo_{n}".encode() for n in numbers]))
    return written
