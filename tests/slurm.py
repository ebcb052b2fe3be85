"""A real one-node Slurm cluster on loopback for the cluster tests, as tests/sshd.py is for SSH.

Debian's slurm-wlm and munge (installed when missing and the tests run as root, as CI does):
a munge key and `munged` running as the munge user, a `slurm.conf` with its own ports, state
and spool folders in a temporary directory, and one node with this machine's CPUs and memory;
`slurmctld` and `slurmd` in the foreground (-D), stopped by their PIDs. SLURM_CONF points the
client commands (sbatch, squeue, scancel, scontrol) at it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.sshd import free_port

DAEMONS = {
    "munged": Path("/usr/sbin/munged"),
    "slurmctld": Path("/usr/sbin/slurmctld"),
    "slurmd": Path("/usr/sbin/slurmd"),
}


def ensure_slurm() -> str | None:
    """None when Slurm and munge are there (installing them if we may), else why they are not."""
    if all(p.exists() for p in DAEMONS.values()):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Slurm is missing: install slurm-wlm and munge (Debian: apt-get install slurm-wlm munge)"
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"],
    ):
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return f"{' '.join(args)} failed: {done.stderr.strip()[-500:]}"
    missing = [str(p) for p in DAEMONS.values() if not p.exists()]
    return f"slurm-wlm and munge installed but {', '.join(missing)} still missing" if missing else None


def node_resources() -> tuple[int, int]:
    """(CPUs, memory in MB) as slurmd sees this machine, memory less a margin for the system."""
    cpus = os.cpu_count() or 1
    memory_mb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_mb = int(line.split()[1]) // 1024
    return cpus, max(512, memory_mb - 1024)


@dataclass
class LoopbackSlurm:
    folder: Path
    conf: Path
    munge_folder: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((self.folder / "log").iterdir())
        )

    def stop(self) -> None:
        user = pwd.getpwuid(os.getuid()).pw_name
        subprocess.run(["scancel", "-u", user], env=os.environ | self.env(), capture_output=True, timeout=60)
        for process in reversed(self.processes):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
        shutil.rmtree(self.munge_folder, ignore_errors=True)


def _wait_for(
    what: str, ready, process: subprocess.Popen, cluster: LoopbackSlurm, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{cluster.logs()}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {timeout_s:.0f} s:\n{cluster.logs()}")


def start_slurm(folder: Path) -> LoopbackSlurm:
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(exist_ok=True)
    # munged runs as the munge user: its folders must be reachable by it, and pytest's temporary
    # folders are not (0700, root's). The socket's folder must be open to every user, the key's not.
    munge = Path(tempfile.mkdtemp(prefix="policypipe-munge-"))
    os.chmod(munge, 0o755)
    socket_dir, key_dir = munge / "run", munge / "key"
    socket_dir.mkdir(mode=0o755)
    key_dir.mkdir(mode=0o700)
    key = key_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    munge_user = pwd.getpwnam("munge")
    for path in (socket_dir, key_dir, key):
        os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
    os.chmod(key, 0o400)
    munge_socket = socket_dir / "munge.socket"

    host = socket.gethostname().split(".")[0]
    cpus, memory_mb = node_resources()
    conf = folder / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=policypipe-test",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                f"StateSaveLocation={folder / 'state'}",
                f"SlurmdSpoolDir={folder / 'spool'}",
                f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
                f"SlurmdPidFile={folder / 'slurmd.pid'}",
                f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "SchedulerType=sched/backfill",
                "SchedulerParameters=bf_interval=1",
                "JobRequeue=1",
                "MinJobAge=600",
                "KillWait=5",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
                f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    cluster = LoopbackSlurm(folder, conf, munge)
    env = os.environ | cluster.env()
    try:
        munged = subprocess.Popen(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                str(DAEMONS["munged"]),
                "-F",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={socket_dir / 'munged.pid'}",
                f"--log-file={folder / 'log' / 'munged.log'}",
                f"--seed-file={socket_dir / 'munged.seed'}",
            ],
            stderr=subprocess.DEVNULL,
        )
        cluster.processes.append(munged)
        _wait_for("munged", munge_socket.exists, munged, cluster)
        ctld = subprocess.Popen(
            [str(DAEMONS["slurmctld"]), "-D", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(folder / "log" / "slurmctld.out", "wb"),
        )
        cluster.processes.append(ctld)
        _wait_for(
            "slurmctld",
            lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0,
            ctld,
            cluster,
        )
        slurmd = subprocess.Popen(
            [str(DAEMONS["slurmd"]), "-D", "-f", str(conf), "-N", host],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(folder / "log" / "slurmd.out", "wb"),
        )
        cluster.processes.append(slurmd)

        def node_idle() -> bool:
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout
            return "idle" in state

        _wait_for("slurmd", node_idle, slurmd, cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster
