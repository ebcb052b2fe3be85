"""The exported policy (`data/policy/`): EMA weights with the normalizer, config, manifest.

config.json holds every PolicyConfig field (the normalization mode, the prediction type and the
DDIM spacing among them) and model.safetensors the weights with the normalizer's scale and
offset, so a loaded policy normalises, encodes and samples as the saved one did. Loading checks
the manifest and reads safetensors and JSON only: no pickled code runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from policypipe.atomic import canonical_json, verify_folder, write_folder_atomic
from policypipe.policy.config import PolicyConfig
from policypipe.policy.diffusion import DiffusionPolicy


def save_policy(
    folder: Path,
    policy: DiffusionPolicy,
    lineage: dict[str, Any],
    runtime: dict[str, Any] | None = None,
    extra_files: dict[str, Callable[[Path], Any]] | None = None,
) -> Path:
    """The policy folder; `runtime` is what a runner needs besides the weights
    (`runtime.spec.RuntimeSpec`, written as runtime.json by the train stage); `extra_files`, {name:
    writer(path)}, more files in it (the monitor's calibration, `monitor.scores.Calibration.files`),
    in its manifest like the rest."""
    state = {k: v.detach().contiguous().cpu() for k, v in policy.state_dict().items()}
    config = canonical_json({"policy": asdict(policy.config)})
    files = {
        "model.safetensors": lambda p: save_file(state, p),
        "config.json": lambda p: p.write_bytes(config),
    }
    if runtime is not None:
        files["runtime.json"] = lambda p: p.write_bytes(canonical_json(runtime))
    files |= extra_files or {}
    return write_folder_atomic(folder, files, extra={"lineage": lineage})


def load_policy(folder: Path) -> DiffusionPolicy:
    problems = verify_folder(folder)
    if problems:
        raise ValueError(f"policy {folder} is damaged: {'; '.join(problems)}")
    raw = json.loads((Path(folder) / "config.json").read_text())["policy"]
    # Every field, none defaulted: a default describes how a new policy is built (the normalization,
    # the prediction type), not how this one was trained.
    names = {f.name for f in fields(PolicyConfig)}
    raw = FIELDS_ADDED_LATER | raw
    missing, unknown = sorted(names - raw.keys()), sorted(raw.keys() - names)
    problems = ([f"lacks {', '.join(missing)}"] if missing else []) + (
        [f"has unknown {', '.join(unknown)}"] if unknown else []
    )
    if problems:
        raise ValueError(
            f"policy {folder} was saved by another version of policypipe (its config.json "
            f"{' and '.join(problems)}): train it again with this version"
        )
    tuples = {f.name for f in fields(PolicyConfig) if "tuple" in str(f.type)}
    config = PolicyConfig(**{k: tuple(v) if k in tuples else v for k, v in raw.items()})
    policy = DiffusionPolicy(config)
    policy.load_state_dict(load_file(Path(folder) / "model.safetensors"))
    return policy.eval()


def is_privileged_control(folder: Path) -> bool:
    """Whether the policy in `folder` is the privileged control (`PolicyConfig.scene_state_dim`), read
    from its config alone; a folder without one is not (loading it says what is wrong)."""
    try:
        return bool(json.loads((Path(folder) / "config.json").read_text())["policy"].get("scene_state_dim"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


# Fields a policy saved before they existed lacks, with the one value every such policy had: one
# gripper and one camera, gripper poses, seen through the camera, the stem's max-pool (a fact of its
# format, not a default that may not describe it).
FIELDS_ADDED_LATER = {
    "grippers": 1,
    "cameras": 1,
    "shared_camera_encoder": False,
    "joint_names": (),
    "scene_state_dim": 0,
    "width_action": "relative",
    "encoder_stem_pool": True,
    "events_from_every_camera": False,
    "condition_on_events": False,
    "event_loss_near_m": 0.0,
    "remember_release": False,
}

# How a trained policy samples, not what it learned: these may differ from training's values.
SAMPLING_FIELDS = ("timestep_spacing", "num_inference_steps")


def with_sampling(policy: DiffusionPolicy, **changes: Any) -> DiffusionPolicy:
    """The same weights sampling another way (DDIM spacing, step count), to measure such a choice
    on trained policies without training again."""
    unknown = sorted(set(changes) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)} changes what the policy learned, not how it samples; "
            f"only {', '.join(SAMPLING_FIELDS)} can be changed after training"
        )
    other = DiffusionPolicy(replace(policy.config, **changes))
    other.load_state_dict(policy.state_dict())
    return other.eval()


def require_trained_with(folder: Path, stats_sha256: str, stats_path: Path) -> None:
    """Refuses to evaluate a policy with statistics other than those it was trained with: their
    split decides which episodes are held out, so others may hold episodes it trained on."""
    recorded = json.loads((Path(folder) / "manifest.json").read_text()).get("lineage", {}).get("stats_sha256")
    if recorded != stats_sha256:
        raise ValueError(
            f"policy {folder} was trained with statistics sha256 {str(recorded)[:12]}..., "
            f"not with {stats_path} "
            f"({stats_sha256[:12]}...): its validation episodes may not be held out for it; "
            "pass the statistics it "
            "was trained with (--stats), or train it again on these (`dvc repro`)"
        )
