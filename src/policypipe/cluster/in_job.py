"""What runs inside a Slurm allocation: the stage's own command as one process of a process group
spanning the job (rank, world and rendezvous from Slurm's environment), the requeue decision
when it checkpointed on Slurm's warning, and the record of where each segment of the job ran.

The submitting side (cluster/submit.py) sets IN_ALLOCATION_ENV for the stage, so that there
the stage trains instead of submitting itself again, and SEGMENTS_ENV to its run's folder.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import submitit

log = logging.getLogger(__name__)

# The exit code of a training process that checkpointed on Slurm's warning signal and wants its
# job requeued (EX_TEMPFAIL: "try again later").
REQUEUE_EXIT_CODE = 75
# Set in the allocation: the stage runs there, it does not submit itself again.
IN_ALLOCATION_ENV = "POLICYPIPE_IN_ALLOCATION"
# Where each segment of a requeued training job records its job id, nodes and GPUs.
SEGMENTS_ENV = "POLICYPIPE_SLURM_SEGMENTS"


class SlurmError(RuntimeError):
    """Slurm cannot be used, or a job failed; the message says which and what to do."""


def in_allocation(environ: Mapping[str, str] = os.environ) -> bool:
    """True in the stage's process that a Slurm job started (run_stage_in_allocation)."""
    return IN_ALLOCATION_ENV in environ


def rendezvous_port(job_id: str) -> int:
    """A port for torch.distributed's rendezvous that two jobs on one node rarely share."""
    return 20_000 + int(job_id) % 20_000


def run_stage_in_allocation(command: list[str], cwd: str, max_requeues: int) -> None:
    """The body of a training job, on every task: the stage's own command as one process of a
    process group spanning the allocation (rank and world from Slurm, rank 0's node the
    rendezvous). Exit code REQUEUE_EXIT_CODE means "checkpointed on Slurm's warning": the job is
    requeued and, started again, resumes from that checkpoint."""
    env = submitit.JobEnvironment()
    child_env = os.environ | {IN_ALLOCATION_ENV: "1"}
    if env.num_tasks > 1:
        child_env |= {
            "RANK": str(env.global_rank),
            "WORLD_SIZE": str(env.num_tasks),
            "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.num_tasks // env.num_nodes),
            "MASTER_ADDR": env.hostnames[0],
            "MASTER_PORT": str(rendezvous_port(env.raw_job_id)),
        }
    child = subprocess.Popen(command, cwd=cwd, env=child_env)

    def forward(signum: int, _frame: Any) -> None:
        # Slurm signals the job's processes; the stage may also be out of its reach (a process group).
        if child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, forward)
    code = child.wait()
    if code == REQUEUE_EXIT_CODE:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts >= max_requeues:
            raise SlurmError(
                f"training was preempted after {restarts} requeues (train.slurm.max_requeues): "
                "rerun the stage to continue from its checkpoint"
            )
        # SIGTERM also comes with `scancel` (a Ctrl-C of the stage): a job being cancelled is not
        # running any more, and must not come back.
        state = _job_state(env.raw_job_id)
        if env.global_rank == 0 and state == "RUNNING":
            subprocess.run(["scontrol", "requeue", env.raw_job_id], check=True, timeout=60)
        elif env.global_rank == 0:
            log.warning("job %s is %s: checkpointed, not requeued", env.raw_job_id, state)
        # No result is written: the job is not over, Slurm runs it again (or it was cancelled).
        sys.exit(REQUEUE_EXIT_CODE)
    if code != 0:
        raise SlurmError(
            f"{' '.join(command)} exited with code {code} on {env.hostname} (rank {env.global_rank})"
        )


def _job_state(job_id: str) -> str:
    done = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() or "gone"


def segment_record() -> dict[str, Any]:
    """Where this segment of a Slurm job runs (provenance: one record per segment)."""
    keys = {
        "job_id": "SLURM_JOB_ID",
        "restart_count": "SLURM_RESTART_COUNT",
        "nodes": "SLURM_JOB_NODELIST",
        "tasks": "SLURM_NTASKS",
        "gpus_on_node": "SLURM_GPUS_ON_NODE",
        "cuda_visible_devices": "CUDA_VISIBLE_DEVICES",
        "partition": "SLURM_JOB_PARTITION",
    }
    record: dict[str, Any] = {name: os.environ.get(var) for name, var in keys.items()}
    record["restart_count"] = int(record["restart_count"] or 0)
    record["host"] = os.uname().nodename
    record["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return record


def record_segment() -> None:
    """Appends this segment's record to the job's segments file; nothing outside a Slurm launch."""
    if path := os.environ.get(SEGMENTS_ENV):
        with open(path, "a") as f:
            f.write(json.dumps(segment_record()) + "\n")


def segments_so_far() -> list[dict] | None:
    """This Slurm job's segments (one per start or requeue), or None outside a Slurm launch."""
    path = os.environ.get(SEGMENTS_ENV)
    if not path or not Path(path).is_file():
        return None
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
