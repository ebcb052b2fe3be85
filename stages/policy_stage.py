"""What the stages that judge the exported policy (eval, rollout) share: their arguments, their
inputs in the run record, and the record of a stage that does not apply to the policy.

Apart from common.py so that the stages before train do not depend on it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from policypipe.atomic import write_json_atomic
from policypipe.lineage.hashing import sha256_file, sha256_path
from policypipe.lineage.provenance import StageRun


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
