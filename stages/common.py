"""What every stage script shares: its params section, logging, and a clean failure.

Stage scripts are thin: they read their section of params.yaml into the library's typed
config, call one library function, write the outputs dvc.yaml declares, and the provenance.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml

from policypipe.atomic import write_json_atomic
from policypipe.config import ConfigError, from_mapping, read_section
from policypipe.lineage.hashing import sha256_file, sha256_path
from policypipe.lineage.provenance import StageRun

T = TypeVar("T")
PARAMS_FILE = Path("params.yaml")


def setup_logging() -> None:
    # Line-buffered, so logs show up as they happen under `dvc repro`, tmux or a pipe.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def policy_stage_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments of a stage that judges the exported policy (eval, rollout): the policy, the
    dataset and statistics it trained on, the metrics, the plots folder and the run record."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True, help="its split: which episodes trained")
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--plots", type=Path, required=True)
    parser.add_argument("--provenance", type=Path, required=True)
    return parser


def record_policy_inputs(run: StageRun, args: argparse.Namespace, stats: dict[str, Any]) -> None:
    """A policy stage's inputs in its run record: the policy's files, the dataset by the fingerprint
    stats recorded (and checked there; not a walk of its files), the statistics."""
    run.inputs[args.policy.as_posix()] = sha256_path(args.policy)
    run.inputs[args.dataset.as_posix() + "#fingerprint"] = stats["dataset_fingerprint"]["sha256"]
    run.inputs[args.stats.as_posix()] = sha256_file(args.stats)


def skip_policy_stage(
    stage: str, params: dict[str, Any], reason: str, args: argparse.Namespace, outputs: list[Path]
) -> None:
    """A policy stage that does not apply to this policy: each of `outputs` says why in JSON
    ({"not_run": reason}), the plots folder is left empty (DVC declares it), and the run record
    names the policy it was not run on."""
    with StageRun(stage, params=params) as run:
        for path in outputs:
            write_json_atomic(path, {"not_run": reason})
        args.plots.mkdir(parents=True, exist_ok=True)
    run.inputs[args.policy.as_posix()] = sha256_path(args.policy)
    run.add_outputs(outputs)
    run.write(args.provenance)
    print(f"{stage}: not run: {reason}")


def load_config(section: str, cls: type[T]) -> T:
    try:
        return from_mapping(cls, read_section(PARAMS_FILE, section), section)
    except ConfigError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    # Under `dvc repro` (which names the stage in DVC_STAGE), DVC removed the stage's outputs
    # before running it: the last good ones are still in its cache, and dvc.lock still names them.
    if removed := _removed_by_dvc(os.environ.get("DVC_STAGE")):
        print(
            f"DVC removed {', '.join(removed)} before running the stage; the last good version is in "
            f"its cache: `dvc checkout {' '.join(removed)}` brings it back",
            file=sys.stderr,
        )
    sys.exit(2)


def _removed_by_dvc(stage: str | None) -> list[str]:
    """The stage's outputs DVC deletes before it runs and can restore: cached, not `persist`."""
    if not stage:
        return []
    try:
        outs = yaml.safe_load(Path("dvc.yaml").read_text())["stages"][stage].get("outs", [])
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return []
    removed = []
    for out in outs:
        path, options = (out, {}) if isinstance(out, str) else next(iter(out.items()))
        options = options or {}
        if options.get("cache", True) and not options.get("persist", False):
            removed.append(path)
    return removed
