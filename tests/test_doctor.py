"""`policypipe doctor`: each check on a real machine state, and the command in a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from policypipe import doctor
from tests.sshd import LoopbackSshd, free_port, keygen
from tests.workspace import checkout_copy, env, run


def test_a_lock_pin_that_differs_from_what_is_installed_fails_naming_it(tmp_path: Path) -> None:
    import numpy

    lock = tmp_path / "requirements.lock"
    lock.write_text(
        f"numpy=={numpy.__version__}\n    # via policypipe\npyyaml==0.0.1\nnot-a-package-here==1.0\n"
    )
    result = doctor.check_lock(lock)
    assert result.status == "fail"
    assert "pyyaml" in result.message.lower() and "(lock: 0.0.1)" in result.message
    assert "not-a-package-here missing" in result.message and "numpy" not in result.message
    lock.write_text(f"numpy=={numpy.__version__}\n")
    assert doctor.check_lock(lock).status == "ok"


def test_too_little_disk_for_the_checkpoints_fails_with_both_sizes(tmp_path: Path) -> None:
    result = doctor.check_disk(tmp_path, {"checkpoints": 2**60})
    assert result.status == "fail" and "checkpoints" in result.message and "free" in result.message
    assert doctor.check_disk(tmp_path, {"checkpoints": 1}).status == "ok"


def test_gpu_processes_of_this_user_are_listed_never_killed_with_a_stand_in_nvidia_smi(
    tmp_path: Path, monkeypatch
) -> None:
    # No GPU here: a stand-in nvidia-smi reports a real process of ours as holding GPU memory.
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "leftover-training-run"]
    )
    try:
        fake = tmp_path / "bin" / "nvidia-smi"
        fake.parent.mkdir()
        fake.write_text(
            f"#!/bin/sh\necho '{leftover.pid}, 1234'\necho '1, 99'\n"
        )  # PID 1 is not ours unless root
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
        result = doctor.check_gpu_processes()
        assert result.status == "warn"
        assert (
            f"PID {leftover.pid} (1234 MiB)" in result.message and "leftover-training-run" in result.message
        )
        assert leftover.poll() is None  # still running
    finally:
        leftover.kill()
        leftover.wait()


@pytest.mark.slow
def test_doctor_in_a_checkout_checks_the_ssh_remote_against_known_hosts(
    sshd: LoopbackSshd, tmp_path: Path
) -> None:
    repo = checkout_copy(tmp_path / "repo")
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{tmp_path / 'remote'}"
    run(repo, "policypipe", "remote", "add", "server", url, "--keyfile", str(sshd.client_key))
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    shown = run(repo, "policypipe", "doctor", "--known-hosts", str(known))
    lines = {
        line.split(":")[0].split(maxsplit=1)[1]: line.split()[0] for line in shown.splitlines() if ":" in line
    }
    assert lines["remote"] == "OK" and lines["environment"] == "OK" and lines["disk"] == "OK"
    assert "slurm" not in lines  # no Slurm executor configured

    known.write_text("")  # an unknown host key: the remote check fails, and so does the command
    done = subprocess.run(
        ["policypipe", "doctor", "--known-hosts", str(known)],
        cwd=repo,
        capture_output=True,
        text=True,
        env=os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 1 and "FAIL remote" in done.stdout


@pytest.mark.slow
def test_doctor_warns_of_secrets_in_dvc_config_and_never_prints_them(tmp_path: Path) -> None:
    repo = checkout_copy(tmp_path / "repo")
    # Set as a user might, with DVC's own commands and no --local: into .dvc/config, which git tracks.
    # Nothing listens on the port: the remote check fails, and its message quotes the URL.
    url = f"ssh://me:url-s3cret@127.0.0.1:{free_port()}/srv/dvc"
    run(repo, "dvc", "remote", "add", "-d", "server", url)
    run(repo, "dvc", "remote", "modify", "server", "passphrase", "phrase-s3cret")
    run(repo, "dvc", "remote", "modify", "--local", "server", "keyfile", str(keygen(tmp_path / "key")))
    done = subprocess.run(
        ["policypipe", "doctor", "--known-hosts", str(tmp_path / "known_hosts")],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env(),
    )
    printed = done.stdout + done.stderr
    assert "url-s3cret" not in printed and "phrase-s3cret" not in printed, printed
    assert done.returncode == 1 and "FAIL remote: server (ssh://me:****@127.0.0.1:" in done.stdout, printed
    warned = [line for line in done.stdout.splitlines() if line.startswith("WARN remote config:")]
    assert len(warned) == 3, printed  # the URL's password, the passphrase, the local key without a URL
    url_line, passphrase_line, local_line = warned
    assert "URL of remote 'server' in .dvc/config, which git tracks, holds a password" in url_line
    assert "`dvc remote modify server url ssh://me@127.0.0.1:" in url_line
    assert "remote 'server' has its passphrase (****) in .dvc/config, which git tracks" in passphrase_line
    assert "`dvc remote modify --local server passphrase PASSPHRASE`" in passphrase_line
    assert "`dvc remote modify --unset server passphrase`" in passphrase_line
    assert "not committed yet" in passphrase_line
    assert ".dvc/config.local sets keyfile for remote 'server' but not its URL" in local_line
