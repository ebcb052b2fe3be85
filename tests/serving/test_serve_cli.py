"""`policypipe serve`: what it refuses before binding, and a real server process stopped by SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import re
import selectors
import signal
import socket
import subprocess
import sys

import pytest

from policypipe.cli import main
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.policy.export import save_policy
from policypipe.runtime.spec import RuntimeSpec
from policypipe.serving.client import PolicyClient, PolicyServerError
from tests.runtime.test_runner import POLICY
from tests.serving.test_server import TOKEN, small


def test_no_token_on_a_non_loopback_bind_is_refused_at_start_up(pipeline, tmp_path, capsys) -> None:
    assert main(["serve", str(pipeline.policy), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "needs a token: pass --token-file" in capsys.readouterr().err
    (tmp_path / "weak").write_text("secret\n")
    assert main(["serve", str(pipeline.policy), "--token-file", str(tmp_path / "weak")]) == 2
    assert "at least 16" in capsys.readouterr().err


def test_a_policy_without_its_runtime_spec_is_refused_with_what_to_do(tmp_path, capsys) -> None:
    (tmp_path / "policy").mkdir()
    assert main(["serve", str(tmp_path / "policy"), "--port", "0"]) == 2
    assert "train it again" in capsys.readouterr().err


def test_a_policy_that_remembers_its_start_is_refused_until_the_server_keeps_it_per_client(
    pipeline, tmp_path, capsys
) -> None:
    config = dataclasses.replace(POLICY, event_loss_weight=1.0, remember_release=True)
    policy = DiffusionPolicy(config)
    policy.fit_normalizers(pipeline.stats)
    save_policy(tmp_path / "policy", policy, {}, RuntimeSpec.read(pipeline.policy).to_json())
    assert main(["serve", str(tmp_path / "policy"), "--port", "0"]) == 2
    assert "run it in process" in capsys.readouterr().err


def first_line(process: subprocess.Popen, timeout_s: float) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise AssertionError(f"the server printed nothing within {timeout_s} s")
    return process.stdout.readline()


@pytest.mark.slow
def test_a_server_process_answers_then_sigterm_closes_its_connections_going_away(
    pipeline, observation, tmp_path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    process = subprocess.Popen(
        [sys.executable, "-m", "policypipe.cli", "serve", str(pipeline.policy), "--port", "0",
         "--token-file", str(token_file), "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    try:
        line = first_line(process, 60)
        port = int(re.search(r"on ws://127\.0\.0\.1:(\d+),", line).group(1))
        assert "clients need the token" in line
        with PolicyClient(f"ws://127.0.0.1:{port}", token_file=token_file) as robot:
            assert robot.act(small(observation), seed=0).execute.any()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
            with pytest.raises(PolicyServerError, match="1001 server shutting down"):
                robot.health()
        assert "SIGTERM: connections closed, server stopped" in process.stdout.read()
        assert "Traceback" not in process.stderr.read()
    finally:
        reap(process)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--max-request-mb", "inf", "--max-request-mb inf: give a positive, finite size"),
        ("--max-request-mb", "nan", "--max-request-mb nan: give a positive, finite size"),
        ("--max-request-mb", "0", "--max-request-mb 0.0: give a positive, finite size"),
        ("--port", "70000", "--port 70000: a TCP port is 0 to 65535"),
        ("--port", "-1", "--port -1: a TCP port is 0 to 65535"),
    ],
)
def test_an_impossible_port_or_request_limit_is_an_error_line_before_the_policy_loads(
    tmp_path, capsys, option: str, value: str, says: str
) -> None:
    # No policy in the folder: refusing it would say "train it again"; the option is refused first.
    (tmp_path / "policy").mkdir()
    assert main(["serve", str(tmp_path / "policy"), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}") and "Traceback" not in err


@pytest.mark.slow
def test_a_server_on_ipv6_loopback_prints_a_url_with_the_address_in_brackets(pipeline) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    process = subprocess.Popen(
        [sys.executable, "-m", "policypipe.cli", "serve", str(pipeline.policy), "--host", "::1",
         "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    try:
        url = re.search(r" on (ws://\S+),", first_line(process, 60)).group(1)
        assert re.fullmatch(r"ws://\[::1\]:\d+", url)
        with PolicyClient(url) as client:
            assert client.health()["status"] == "ok"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        reap(process)


def reap(process: subprocess.Popen) -> None:
    """The server ended, killed if a failed assertion left it running, and its pipes closed."""
    if process.poll() is None:
        process.kill()
    process.wait()
    process.stdout.close()
    process.stderr.close()
