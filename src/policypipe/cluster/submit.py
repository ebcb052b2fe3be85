"""The submitting side of Slurm, where `dvc repro` runs (a login node): submit through submitit,
wait (streaming a job's log), collect outcomes, cancel on Ctrl-C. What runs inside the
allocation is cluster/in_job.py.

submitit writes the sbatch script, pickles the call, runs it in the allocation and pickles its
result; it learns a job's state from `sacct`, which needs Slurm's accounting database. Many
small clusters run without one, so the waiting here asks `squeue` instead (every cluster has
it): a job is running while squeue lists it, and its outcome is submitit's result file, or the
lack of one (killed, node failure, out of memory, time limit).

Every job's files, its logs included, go to the executor's folder (a run's own, git-ignored):
submitit passes --output and --error, so Slurm never falls back to `slurm-%j.out` in the
directory it was submitted from.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import submitit
from submitit.core.utils import pickle_load

from policypipe.cluster.in_job import SEGMENTS_ENV, SlurmError, run_stage_in_allocation
from policypipe.cluster.resources import with_local_values

log = logging.getLogger(__name__)

CLIENT_TOOLS = ("sbatch", "squeue", "scancel", "scontrol")


def local_resources(config: Any) -> Any:
    """A stage's `slurm` params with the untracked file's cluster-specific values (resources.LOCAL_FILE)."""
    try:
        return with_local_values(config)
    except (ValueError, OSError) as exc:
        raise SlurmError(str(exc)) from None


def check_reachable(timeout_s: float = 20) -> str:
    """The cluster's name for the messages, or SlurmError saying what is missing."""
    missing = [tool for tool in CLIENT_TOOLS if shutil.which(tool) is None]
    if missing:
        raise SlurmError(
            f"{', '.join(missing)} not found on PATH: this machine is not a Slurm submit node. "
            "Run the stage on one, or set the executor/launcher back to local in params.yaml"
        )
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`scontrol ping` did not answer within {timeout_s:.0f} s: is slurmctld up?"
        ) from None
    if done.returncode != 0 or "UP" not in done.stdout:
        raise SlurmError(
            f"Slurm's controller does not answer (`scontrol ping`: {(done.stdout + done.stderr).strip()}); "
            "check SLURM_CONF and that slurmctld runs"
        )
    return done.stdout.strip()


def make_executor(
    folder: Path,
    *,
    job_name: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    cpus_per_task: int,
    mem_gb: float,
    time_min: int,
    nodes: int = 1,
    tasks_per_node: int = 1,
    gpus_per_node: int = 0,
    array_parallelism: int | None = None,
    signal_before_end_s: int | None = None,
    environment: dict[str, str] | None = None,
) -> submitit.SlurmExecutor:
    """A submitit executor; the job runs this interpreter (a virtualenv on a shared filesystem)."""
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    extra: dict[str, Any] = {"requeue": True} if signal_before_end_s else {}
    if signal_before_end_s:
        # USR1 to every task of the job, this long before the time limit (submitit's own default
        # is USR2, handled by submitit; policypipe's training handles USR1 itself).
        extra["signal"] = f"USR1@{signal_before_end_s}"
    if account:
        extra["account"] = account
    setup = [f"export {key}={shlex.quote(value)}" for key, value in (environment or {}).items()]
    executor.update_parameters(
        job_name=job_name,
        time=time_min,
        nodes=nodes,
        ntasks_per_node=tasks_per_node,
        cpus_per_task=cpus_per_task,
        mem=f"{max(1, round(mem_gb * 1024))}M",
        stderr_to_stdout=False,
        additional_parameters=extra,
        setup=setup,
        **({"partition": partition} if partition else {}),
        **({"qos": qos} if qos else {}),
        **({"gpus_per_node": gpus_per_node} if gpus_per_node else {}),
        **({"array_parallelism": array_parallelism} if array_parallelism else {}),
    )
    return executor


@dataclass(frozen=True)
class QueuedJob:
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str


def queued_jobs() -> dict[str, QueuedJob]:
    """This user's jobs that Slurm still holds, by submitit's job id ("123" or "123_4" for an
    array task). Asking by user, not by id: squeue refuses ids it has already forgotten."""
    user = pwd.getpwuid(os.getuid()).pw_name
    for attempt in range(5):
        done = subprocess.run(
            ["squeue", "-h", "-r", "-u", user, "-o", "%F|%K|%T|%r"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0:
            break
        # A busy controller answers later; a job must not be taken for finished meanwhile.
        log.warning("squeue failed (%s), asking again", done.stderr.strip())
        time.sleep(2 * (attempt + 1))
    else:
        raise SlurmError(f"squeue keeps failing: {done.stderr.strip()}")
    jobs = {}
    for line in done.stdout.splitlines():
        array_id, task, state, reason = line.split("|", 3)
        jobs[array_id if task in ("N/A", "") else f"{array_id}_{task}"] = QueuedJob(state, reason)
    return jobs


def cancel(jobs: Iterable[submitit.Job]) -> None:
    ids = sorted({job.job_id.split("_")[0] for job in jobs})
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
        log.warning("cancelled Slurm job(s) %s", ", ".join(ids))


class LogTail:
    """Copies what a job writes to its log files to this process's streams, as it comes."""

    def __init__(self, pairs: Sequence[tuple[Path, TextIO]]) -> None:
        self.pairs = list(pairs)
        self.offsets = [0] * len(self.pairs)

    def poll(self) -> None:
        for i, (path, sink) in enumerate(self.pairs):
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < self.offsets[i]:  # truncated: a new segment of a requeued job
                self.offsets[i] = 0
            if size == self.offsets[i]:
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[i])
                data = f.read(size - self.offsets[i])
            self.offsets[i] = size
            sink.write(data.decode(errors="replace"))
            sink.flush()


def wait(
    jobs: Sequence[submitit.Job],
    *,
    on_finished: Callable[[submitit.Job], None] | None = None,
    tail: LogTail | None = None,
    poll_s: float = 1.0,
) -> None:
    """Blocks until Slurm holds none of `jobs`; Ctrl-C (or any error here) cancels them all.

    A job requeued after a preemption waits in Slurm for a fixed two minutes (its begin time)
    before it may start again; for our own requeued jobs that hold is shortened to the time the
    stopped run's processes may take to end (Slurm's KillWait, plus a margin): a node's daemon
    refuses to start a job it is still tearing down ("already killed"), and the job would end
    without a result.
    """
    remaining = {job.job_id: job for job in jobs}
    released: set[str] = set()
    held_since: dict[str, float] = {}  # requeued jobs of ours, since when they are seen held
    settle_s: int | None = None
    try:
        while remaining:
            queued = queued_jobs()
            for job_id in list(remaining):
                entry = queued.get(job_id)
                if entry is None:
                    job = remaining.pop(job_id)
                    if on_finished is not None:
                        on_finished(job)
                elif entry.state == "PENDING" and entry.reason == "BeginTime" and job_id not in released:
                    settle_s = _requeue_settle_s() if settle_s is None else settle_s
                    since = held_since.setdefault(job_id, time.monotonic())
                    # Lifted once the stopped run has had time to end: StartTime=now, not a time
                    # ahead, which would wait for the scheduler's next cycle (up to a minute).
                    if time.monotonic() - since >= settle_s:
                        subprocess.run(
                            ["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                            capture_output=True,
                            timeout=60,
                        )
                        released.add(job_id)
                        del held_since[job_id]
                        log.info(
                            "job %s was requeued: lifted Slurm's requeue hold after %d s", job_id, settle_s
                        )
                elif entry.state == "RUNNING":
                    released.discard(job_id)
            if tail is not None:
                tail.poll()
            if remaining:
                time.sleep(poll_s)
        if tail is not None:
            tail.poll()
    except BaseException:
        cancel(remaining.values())
        raise


def _requeue_settle_s(margin_s: int = 5) -> int:
    """Slurm's KillWait (how long a stopped job's processes get before SIGKILL; 30 s unless the
    cluster sets it) plus a margin."""
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    found = re.search(r"^KillWait\s*=\s*(\d+)", done.stdout, re.MULTILINE)
    return (int(found[1]) if found else 30) + margin_s


@dataclass(frozen=True)
class Outcome:
    ok: bool
    value: Any  # the call's return value, or why there is none


def outcome(job: submitit.Job) -> Outcome:
    """What a finished job left: its result, the exception it raised, or nothing (killed)."""
    path = job.paths.result_pickle
    if not path.exists():
        return Outcome(
            False,
            f"Slurm job {job.job_id} ended without a result (killed, out of memory, time limit or "
            f"node failure); its log: {job.paths.stderr}",
        )
    kind, value = pickle_load(path)
    if kind == "success":
        return Outcome(True, value)
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    return Outcome(
        False, f"Slurm job {job.job_id} failed: {lines[-1] if lines else value}; its log: {job.paths.stderr}"
    )


def run_stage_as_job(
    command: list[str],
    *,
    cwd: Path,
    folder: Path,
    resources: Any,
    num_processes: int,
    job_name: str,
    stdout: TextIO,
    stderr: TextIO,
) -> str:
    """Submits `command` as one job of `num_processes` tasks over `resources.nodes` nodes (a
    SlurmAllocationConfig), streams rank 0's log and blocks until the job is over, requeues
    included. Returns the job id; a failed job raises SlurmError with its log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    segments = folder / "segments.jsonl"
    segments.unlink(missing_ok=True)  # a new job: its own segments only
    executor = make_executor(
        folder,
        job_name=job_name,
        partition=resources.partition,
        account=resources.account,
        qos=resources.qos,
        cpus_per_task=resources.cpus_per_task,
        mem_gb=resources.mem_gb,
        time_min=resources.time_min,
        nodes=resources.nodes,
        tasks_per_node=num_processes // resources.nodes,
        gpus_per_node=resources.gpus_per_node,
        signal_before_end_s=resources.signal_before_end_s,
        environment={SEGMENTS_ENV: str(segments)},
    )
    job = executor.submit(run_stage_in_allocation, command, str(cwd), resources.max_requeues)
    log.info(
        "submitted Slurm job %s (%d process(es) on %d node(s)); its files: %s",
        job.job_id,
        num_processes,
        resources.nodes,
        folder,
    )
    wait([job], tail=LogTail([(job.paths.stdout, stdout), (job.paths.stderr, stderr)]))
    result = outcome(job)
    if not result.ok:
        raise SlurmError(result.value)
    return job.job_id
