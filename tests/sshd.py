"""A real OpenSSH server on loopback for the remote tests, and a proxy that cuts a transfer.

The server runs as a child of the test process with its own host key, client key, config and
port, never the system's; it is stopped by its PID. If `sshd` is missing it is installed from
Debian's packages when the tests run as root (CI does), as the remote issue asks.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


def ensure_sshd() -> str | None:
    """None when sshd is there (installing it if we may), else why it is not."""
    if SSHD.exists():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{SSHD} is missing: install openssh-server (Debian: apt-get install openssh-server)"
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
    ):
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return f"{' '.join(args)} failed: {done.stderr.strip()[-500:]}"
    return None if SSHD.exists() else "openssh-server installed but /usr/sbin/sshd is still missing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@dataclass
class LoopbackSshd:
    """A running sshd on 127.0.0.1:port that accepts `client_key` for the current user."""

    process: subprocess.Popen
    port: int
    user: str
    client_key: Path
    host_public_key: Path
    folder: Path

    def known_hosts_line(self) -> str:
        algorithm, key = self.host_public_key.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {algorithm} {key}\n"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)


def start_sshd(folder: Path) -> LoopbackSshd:
    folder.mkdir(parents=True, exist_ok=True)
    host_key, client_key = keygen(folder / "host_ed25519"), keygen(folder / "client_ed25519")
    authorized = folder / "authorized_keys"
    shutil.copy(folder / "client_ed25519.pub", authorized)
    port = free_port()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n"
        # The test's temporary folders are not root-owned 0755 all the way up.
        "StrictModes no\nSubsystem sftp internal-sftp\nMaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n"
    )
    try:
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory, absent until sshd first runs
    except PermissionError:
        pass  # not root: sshd runs unprivileged and does not need it
    # -D: stay in the foreground, so the PID is the server's own; -e: log to stderr.
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)], stderr=open(folder / "sshd.log", "wb")
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}: {(folder / 'sshd.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        process.kill()
        raise RuntimeError("sshd did not listen within 15 s")
    import pwd

    return LoopbackSshd(
        process, port, pwd.getpwuid(os.getuid()).pw_name, client_key, folder / "host_ed25519.pub", folder
    )


class CuttingProxy:
    """Forwards 127.0.0.1:port to the server and cuts the connection after `budget` upstream bytes.

    A network that drops in the middle of a push, at a point the test chooses in bytes rather
    than in time, so the interruption happens part-way on any machine.
    """

    def __init__(self, target_port: int, budget: int) -> None:
        self.target_port, self.budget = target_port, budget
        self.sent = 0
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            # Without TCP_NODELAY each SFTP request waits for the delayed ACK of the one before
            # (Nagle's algorithm on a relayed request/response stream): ~40 ms a file, a push of
            # 12 MB in 35 s instead of about one.
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while not self.cut.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    self.sent += len(data)
                    if self.sent > self.budget:
                        self.cut.set()
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.cut.set()
        self.listener.close()
