"""`train.launcher: slurm` against a real one-node Slurm: `dvc repro train` submits the stage as
a job of two processes and streams its log; Slurm's warning signal (USR1) part-way makes both
checkpoint, the job requeues and resumes, and the policy is bitwise the one of an uninterrupted
local launch of the same two processes. A cancelled job does not requeue itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import as_in_a_terminal, sampled_checkout, set_params
from tests.workspace import SMALL_MODEL, env, run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The unit tests' tiny model (on the frame and crop sizes of this repo's params.yaml, 64x64 frames
# now): what is tested is the launch, the signals and the resume, not what the model learns; the
# demo's U-Net made a loaded 2-core machine take 4 minutes over the first test alone.
TINY = {k: v for k, v in SMALL_MODEL.items() if k not in ("image_size", "crop_size")}
SHORT = {
    "steps": 40,
    "batch_size": 8,
    "val_every": 10,
    "val_batches": 1,
    "checkpoint_every": 10,
    "encoder_pretrain_steps": 3,  # the demo's pretraining on the grasp and release labels, kept short
    "model": TINY,
}
# Two processes of one thread each, as a two-GPU job's: the process group is what a requeue must
# bring back (ranks, world size and the rendezvous from Slurm's environment in every segment). Each
# with data-loading workers, which Slurm's USR1 reaches too: they must not die of it.
TWO_PROCESSES = {"num_processes": 2, "cpu_threads": 1, "num_workers": 2}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """3 sample recordings, the pipeline run up to `stats`, a short training configured."""
    repo = sampled_checkout(tmp_path_factory.mktemp("checkout"), 3, 7, "stats")
    set_params(repo, "train", **SHORT)
    return repo


def last_step(log: Path) -> int:
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return 0
    return json.loads(lines[-1])["step"] if lines else 0


def our_job() -> str | None:
    out = subprocess.run(
        ["squeue", "-h", "-n", "policypipe-train", "-o", "%i|%T"], capture_output=True, text=True
    ).stdout
    running = [line.split("|")[0] for line in out.splitlines() if line.endswith("|RUNNING")]
    return running[0] if running else None


def test_usr1_part_way_checkpoints_both_processes_requeues_and_ends_with_the_uninterrupted_weights(
    slurm_cluster, repo: Path
) -> None:
    """One node here; several nodes differ only in MASTER_ADDR being the first of them."""
    set_params(repo, "train", **TWO_PROCESSES)
    run(repo, "dvc", "repro", "train")  # torch's launcher on this machine
    uninterrupted = (repo / "data/policy/model.safetensors").read_bytes()
    set_params(repo, "train", launcher="slurm", slurm={"cpus_per_task": 1, "mem_gb": 1, "time_min": 30})

    log = repo / "data/train/log.jsonl"
    log.unlink()  # the local run's: the job's own log tells how far it is
    stage = subprocess.Popen(
        ["dvc", "repro", "train"],
        cwd=repo,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(stage.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while (last_step(log) < 15 or our_job() is None) and time.monotonic() < deadline:
        time.sleep(0.2)
    job = our_job()
    assert job is not None, "".join(output)
    signalled_at = time.monotonic()
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    stopped_at = None
    while stage.poll() is None and time.monotonic() < deadline:
        if stopped_at is None and "SIGUSR1: stopped at step" in "".join(output):
            stopped_at = last_step(log)
        if stopped_at is not None and last_step(log) > stopped_at:
            break
        time.sleep(0.2)
    resumed_after_s = time.monotonic() - signalled_at
    assert stage.wait(timeout=300) == 0, "".join(output)
    reader.join()
    text = "".join(output)

    assert (repo / "data/policy/model.safetensors").read_bytes() == uninterrupted
    assert stopped_at is not None and 15 <= stopped_at < SHORT["steps"], text
    assert f"Slurm job {job} finished" in text  # the stage waited for the job, its log streamed here
    provenance = json.loads((repo / "metrics/provenance/train.json").read_text())
    segments = provenance["details"]["slurm_segments"]
    assert [s["restart_count"] for s in segments] == [0, 1] and {s["job_id"] for s in segments} == {job}
    assert all(s["nodes"] and s["host"] and s["tasks"] == "2" for s in segments)
    print(
        f"USR1 at step >= 15: stopped at step {stopped_at}, "
        f"training again {resumed_after_s:.1f} s after the signal"
    )


def test_ctrl_c_of_the_stage_cancels_the_job_and_it_does_not_come_back(slurm_cluster, repo: Path) -> None:
    # Cancelling sends the job SIGTERM, as a preemption does; this time it must not requeue itself.
    # Without data-loading workers, which SIGTERM ends too, training gets to its checkpoint and
    # to the requeue decision.
    set_params(
        repo,
        "train",
        launcher="slurm",
        slurm={"cpus_per_task": 2, "mem_gb": 2, "time_min": 30},
        steps=SHORT["steps"] + 20,
        num_processes=1,
        cpu_threads=2,
        num_workers=0,
    )  # another run than the first test's
    log = repo / "data/train/log.jsonl"
    log.unlink(missing_ok=True)
    stage = subprocess.Popen(
        ["dvc", "repro", "train"],
        cwd=repo,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=as_in_a_terminal,
    )
    deadline = time.monotonic() + 300
    while (last_step(log) < 5 or our_job() is None) and time.monotonic() < deadline:
        time.sleep(0.2)
    job = our_job()
    assert job is not None
    os.killpg(stage.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends to the foreground group
    output, _ = stage.communicate(timeout=120)
    assert stage.returncode != 0
    time.sleep(10)  # long enough for a requeued job to show up again as pending
    queued = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()
    assert queued in ("", "COMPLETING"), f"job {job} is {queued}:\n{output}"
    job_log = (repo / "data/train.slurm" / f"{job}_0_log.err").read_text()
    assert "SIGTERM: stopped at step" in job_log and f"job {job} is" in job_log  # checkpointed, not requeued
