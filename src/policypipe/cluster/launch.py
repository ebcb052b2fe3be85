"""How the train stage starts: here, as several local processes under torch's launcher, or as one
Slurm job that runs the same command on each of its tasks (and there, trains).

The stage decides once, from its config and environment (`how_to_launch`); a relaunched or
submitted stage finds WORLD_SIZE or in_job.IN_ALLOCATION_ENV set and trains where it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TextIO

from policypipe.cluster import submit
from policypipe.cluster.in_job import in_allocation

Launch = Literal["here", "processes", "slurm"]


def how_to_launch(launcher: str, num_processes: int, environ: Mapping[str, str] = os.environ) -> Launch:
    """ "slurm": submit the stage as a job; "processes": start it as num_processes local processes;
    "here": this process trains (alone, or as one rank of a launch already made)."""
    if launcher == "slurm" and not in_allocation(environ):
        return "slurm"
    if launcher == "local" and num_processes > 1 and "WORLD_SIZE" not in environ:
        return "processes"
    return "here"


def torchrun_command(processes: int, argv: list[str]) -> list[str]:
    """`argv` (a script and its arguments) as `processes` processes, one a GPU or CPU processes
    with gloo. --standalone: a rendezvous on this machine, on a port the launcher picks itself.

    torch's launcher sets the environment accelerate reads; for several machines, start the
    stage with `accelerate launch` and your accelerate config instead: nothing is relaunched then.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        *argv,
    ]


def run_as_processes(processes: int, argv: list[str]) -> int:
    """Runs `argv` as `processes` local processes; their launcher's exit code."""
    return subprocess.call(torchrun_command(processes, argv))


def job_folder(run_dir: Path) -> Path:
    """A training job's submitit files and logs: beside its run folder (data/train -> data/train.slurm)."""
    return run_dir.parent / f"{run_dir.name}.slurm"


def run_training_job(
    command: list[str],
    *,
    resources: Any,
    num_processes: int,
    run_dir: Path,
    stdout: TextIO,
    stderr: TextIO,
) -> str:
    """The train stage's `command` as one Slurm job of `num_processes` tasks (`resources`: a
    SlurmAllocationConfig with the local values, submit.local_resources), its log streamed to
    `stdout`/`stderr`, requeues included. Returns the job id; a failed job raises SlurmError.
    Requeued after a preemption, the job resumes from the checkpoint written on Slurm's warning."""
    return submit.run_stage_as_job(
        command,
        cwd=Path.cwd(),
        folder=job_folder(run_dir),
        resources=resources,
        num_processes=num_processes,
        job_name="policypipe-train",
        stdout=stdout,
        stderr=stderr,
    )
