"""`convert.executor: slurm` against a real one-node Slurm: the same dataset bytes as a local
run, a killed array task retried, a recording whose task always dies reported, the rest kept."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import as_in_a_terminal, set_params
from tests.sshd import free_port
from tests.workspace import env, run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM = {
    "cpus_per_task": 1,
    "mem_gb": 1,
    "time_min": 10,
    "recordings_per_task": 2,
    "max_concurrent": 2,
    "retries": 2,
}


def convert(repo: Path, out: str, cache: str) -> dict:
    run(
        repo,
        "python",
        "stages/convert.py",
        "--manifest",
        "data/manifest.json",
        "--export",
        "data/raw",
        "--out",
        out,
        "--cache",
        cache,
        "--metrics",
        f"{out}.metrics.json",
        "--report",
        f"{out}.report.json",
        "--provenance",
        f"{out}.provenance.json",
    )
    return json.loads((repo / f"{out}.provenance.json").read_text())


def files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def test_slurm_array_gives_the_same_dataset_bytes_as_local(slurm_cluster, paired_repo: Path) -> None:
    """As docs/cluster.md, "Cluster (Slurm)": the executor set in params.yaml, then `dvc repro`."""
    run(paired_repo, "dvc", "repro", "convert")
    local = files(paired_repo / "data/dataset.zarr")
    shutil.rmtree(paired_repo / "data/convert_cache")  # the array tasks convert every recording anew
    set_params(paired_repo, "convert", executor="slurm", slurm=SLURM)
    shown = run(paired_repo, "dvc", "repro", "convert")

    assert "Running stage 'convert'" in shown
    assert files(paired_repo / "data/dataset.zarr") == local
    tasks = json.loads((paired_repo / "metrics/provenance/convert.json").read_text())["details"][
        "slurm_tasks"
    ]
    assert len(tasks) == 2 and all(t["ok"] for t in tasks)  # 4 recordings, 2 a task
    assert sorted(stem for t in tasks for stem in t["recordings"]) == [f"rec_000{i}" for i in range(1, 5)]


def slurm_processes(jobs: Path) -> list[tuple[int, dict[str, str], str]]:
    """(pid, environment, kernel wait channel) of every process of the Slurm jobs whose submitit
    files are under `jobs` (their command line names it; forked workers inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(jobs) not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                continue
            raw = (proc / "environ").read_bytes().decode(errors="replace")
            wchan = (proc / "wchan").read_text()
        except OSError:
            continue  # ended meanwhile
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if "SLURM_JOB_ID" in env:
            found.append((int(proc.name), env, wchan))
    return found


def submitit_id(env: dict[str, str]) -> str:
    """The job id as submitit names it (and its log files): "A_T" for an array task."""
    if "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def kill_stuck_tasks(jobs: Path, stems: dict[str, list[str]], stop: threading.Event, on_kill) -> None:
    """SIGKILLs every process of each Slurm task stuck opening a FIFO, as the out-of-memory killer
    or a node failure would, noting under which recording's stem (from the task's log) it died.
    A FIFO blocks its reader until a writer comes (the kernel names that wait
    `wait_for_partner`), so the task is certainly running, and stuck, when it is killed."""
    done: set[str] = set()
    while not stop.is_set():
        processes = slurm_processes(jobs)
        for job_id in {
            submitit_id(task_env) for _, task_env, wchan in processes if wchan == "wait_for_partner"
        } - done:
            logs = list(jobs.rglob(f"{job_id}_0_log.err"))
            text = logs[0].read_text(errors="replace") if logs else ""
            stem = next((s for s in stems if f"converting {s}" in text), None)
            if stem is None:
                continue  # its log is not written yet
            for pid, task_env, _ in processes:
                if submitit_id(task_env) == job_id:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            done.add(job_id)
            stems[stem].append(job_id)
            on_kill(stem)
        time.sleep(0.2)


def test_a_killed_task_is_retried_and_a_recording_that_always_kills_its_task_is_reported(
    slurm_cluster, paired_repo: Path
) -> None:
    set_params(paired_repo, "convert", executor="slurm", slurm=SLURM)
    manifest = json.loads((paired_repo / "data/manifest.json").read_text())
    recordings = [paired_repo / "data/raw" / r["files"]["vio"]["path"] for r in manifest["recordings"]]
    flaky, doomed = recordings[1], recordings[2]
    kept_aside, doomed_real = flaky.with_name("flaky.real"), doomed.with_name("doomed.real")
    shutil.copy2(flaky, kept_aside)
    shutil.copy2(doomed, doomed_real)
    for fifo in (flaky, doomed):
        fifo.unlink()
        os.mkfifo(fifo)

    flaky_stem, doomed_stem = (p.name.removesuffix("_vio.mcap") for p in (flaky, doomed))
    killed: dict[str, list[str]] = {flaky_stem: [], doomed_stem: []}

    def on_kill(stem: str) -> None:
        if stem == flaky_stem and kept_aside.exists():
            os.replace(kept_aside, flaky)  # the flaky recording's retry finds its real file

    stop = threading.Event()
    watcher = threading.Thread(
        target=kill_stuck_tasks,
        args=(paired_repo / "data/cache-fail/slurm-jobs", killed, stop, on_kill),
        daemon=True,
    )
    watcher.start()
    try:
        provenance = convert(paired_repo, "data/fail.zarr", "data/cache-fail")
    finally:
        stop.set()
        watcher.join()
        os.replace(doomed_real, doomed)  # the module's later tests get the export back whole

    report = json.loads((paired_repo / "data/fail.zarr.report.json").read_text())
    kept = sorted(ep["stem"] for ep in report["episodes"])
    assert kept == sorted(r.name.removesuffix("_vio.mcap") for r in recordings if r != doomed)
    [excluded] = report["excluded"]
    assert excluded["stem"] == doomed_stem
    assert excluded["excluded"] == "slurm_task_failed" and "3 time(s)" in excluded["detail"]
    assert len(killed[flaky_stem]) == 1 and len(killed[doomed_stem]) == 3  # the first try and both retries
    attempts = provenance["details"]["slurm_tasks"]
    assert [a["ok"] for a in attempts if excluded["stem"] in a["recordings"]] == [False, False, False]
    assert max(a["attempt"] for a in attempts) == 2


def test_doctor_checks_slurm_when_an_executor_is_slurm(
    slurm_cluster, paired_repo: Path, tmp_path: Path
) -> None:
    set_params(paired_repo, "convert", executor="slurm", slurm=SLURM)
    assert "OK   slurm: Slurmctld(primary) at" in run(paired_repo, "policypipe", "doctor")
    # The same cluster's configuration, its controller's port one where nothing listens.
    down = tmp_path / "slurm.conf"
    down.write_text(
        re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={free_port()}", slurm_cluster.conf.read_text())
    )
    gone = env() | {"SLURM_CONF": str(down)}
    done = subprocess.run(["policypipe", "doctor"], cwd=paired_repo, env=gone, capture_output=True, text=True)
    assert done.returncode == 1 and "FAIL slurm: Slurm's controller does not answer" in done.stdout


def test_ctrl_c_of_the_stage_cancels_its_jobs(slurm_cluster, paired_repo: Path) -> None:
    set_params(paired_repo, "convert", executor="slurm", slurm=SLURM)
    manifest = json.loads((paired_repo / "data/manifest.json").read_text())
    stuck = paired_repo / "data/raw" / manifest["recordings"][0]["files"]["vio"]["path"]
    aside = stuck.with_name("stuck.real")
    os.replace(stuck, aside)
    os.mkfifo(stuck)  # its task waits there until cancelled
    try:
        stage = subprocess.Popen(
            [
                "python",
                "stages/convert.py",
                "--manifest",
                "data/manifest.json",
                "--export",
                "data/raw",
                "--out",
                "data/ctrl-c.zarr",
                "--cache",
                "data/cache-ctrl-c",
                "--metrics",
                "m.json",
                "--report",
                "r.json",
                "--provenance",
                "p.json",
            ],
            cwd=paired_repo,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_in_a_terminal,
        )
        jobs = paired_repo / "data/cache-ctrl-c/slurm-jobs"

        def stuck_on_the_fifo() -> bool:
            return any(wchan == "wait_for_partner" for _, _, wchan in slurm_processes(jobs))

        deadline = time.monotonic() + 120
        while not stuck_on_the_fifo() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stuck_on_the_fifo(), "no task got to the recording"
        stage.send_signal(signal.SIGINT)
        _, stderr = stage.communicate(timeout=120)
    finally:
        # A conversion process orphaned by the cancellation (proctrack/linuxproc loses a task's
        # forked workers once the task is gone) is still waiting on the FIFO: an empty write end ends it.
        with contextlib.suppress(OSError):
            os.close(os.open(stuck, os.O_WRONLY | os.O_NONBLOCK))
        os.replace(aside, stuck)
    assert stage.returncode != 0 and "cancelled Slurm job" in stderr
    queued = subprocess.run(
        ["squeue", "-h", "-n", "policypipe-convert"], capture_output=True, text=True
    ).stdout
    assert queued.strip() == "" or all(" CG " in line for line in queued.splitlines())  # gone, or completing
    assert not (paired_repo / "data/ctrl-c.zarr").exists()
