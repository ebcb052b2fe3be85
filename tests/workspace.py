"""Real repositories for end-to-end tests: a copy of this checkout, real git, real DVC."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | GIT_ENV | {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "DVC_NO_ANALYTICS": "1"}


def run(cwd: Path, *args: str, timeout_s: float = 600) -> str:
    done = subprocess.run(args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def run_failing(cwd: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Runs a command that is expected to fail; the caller checks how."""
    done = subprocess.run(args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode != 0, (
        f"{' '.join(args)} succeeded but should have failed:\n{done.stdout}\n{done.stderr}"
    )
    return done


def stages_run(output: str) -> list[str]:
    """The stages a `dvc repro` ran, in order, from what it printed."""
    return re.findall(r"Running stage '([^']+)'", output)


# What `dvc status --json` says of a repository where nothing is to be done: the export's check
# runs on every repro (dvc.yaml, `check_export`).
NOTHING_TO_DO = {"check_export": ["always changed"]}


def checkout_copy(dest: Path) -> Path:
    """This working tree's files (tracked and untracked, not ignored) in a fresh git repository."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = REPO_ROOT / rel
        if src.is_file() and not rel.startswith("data/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    run(dest, "git", "init", "-q", "-b", "main")
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-q", "-m", "copy")
    return dest


# A model as small as the checks allow (the unit tests' size, tests/training/conftest.py) on
# 48x48 frames: every stage runs for real, in seconds rather than the demo size's minutes
# (eval sampled 20 DDIM steps of the demo's U-Net for every sample).
SMALL_IMAGES = [48, 48]
SMALL_MODEL = {
    "image_size": SMALL_IMAGES,
    "crop_size": [44, 44],
    "encoder_widths": [16, 32],
    "image_feature_dim": 16,
    "num_keypoints": 8,
    "down_dims": [16, 32],
    "diffusion_step_embed_dim": 16,
    "num_inference_steps": 4,
}


def shorten_training(repo: Path) -> None:
    """The demo's params, with a training run of a few steps of a tiny model on small frames and
    a lighter evaluation: the stages run for real, quickly."""
    import yaml

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["convert"] |= {"image_size": SMALL_IMAGES}
    params["train"] |= {
        "steps": 6,
        "batch_size": 8,
        "val_every": 3,
        "val_batches": 1,
        "checkpoint_every": 3,
        "num_workers": 0,
        "encoder_pretrain_steps": 3,  # the demo's pretraining on the grasp and release labels, kept short
    }
    params["train"]["model"] = params["train"].get("model", {}) | SMALL_MODEL
    params["eval"] |= {
        "stride": 16,
        "spread_observations": 2,
        "spread_samples": 3,
        "bootstrap_resamples": 200,
    }
    params["rollout"] |= {"episodes": 2, "time_limit_s": 0.5, "videos": 1, "workers": 1}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "git", "commit", "-qam", "short training")
