"""The SSH remote, for real: a loopback sshd, `dvc push`/`dvc pull` of the pipeline's outputs,
an interrupted push, a corrupted remote object, and the host-key check."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sshd import CuttingProxy, LoopbackSshd, keygen
from tests.workspace import NOTHING_TO_DO, env, run, run_failing

pytestmark = pytest.mark.slow


def url(server: LoopbackSshd, folder: Path, port: int | None = None) -> str:
    return f"ssh://{server.user}@127.0.0.1:{port or server.port}{folder}"


def add_remote(repo: Path, name: str, server: LoopbackSshd, folder: Path, port: int | None = None) -> None:
    run(
        repo,
        "policypipe",
        "remote",
        "add",
        name,
        url(server, folder, port),
        "--keyfile",
        str(server.client_key),
        "--no-default",
    )


def remote_objects(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".tmp")]


def cache_objects(repo: Path) -> list[Path]:
    return [p for p in (repo / ".dvc/cache/files/md5").rglob("*") if p.is_file()]


def fresh_clone(repo: Path, dest: Path) -> Path:
    """What another machine has after `git clone`: code, dvc.lock, no cache and no outputs."""
    subprocess.run(["git", "clone", "-q", str(repo), str(dest)], check=True)
    assert not (dest / ".dvc/cache").exists() and not (dest / "data/policy").exists()
    return dest


def assert_pulled_outputs_verify(clone: Path, original: Path) -> None:
    assert run(clone, "policypipe", "verify", "data/dataset.zarr").startswith("OK")
    assert run(clone, "policypipe", "verify", "data/policy").startswith("OK")
    assert json.loads(run(clone, "dvc", "status", "--json")) == NOTHING_TO_DO
    for path in ("data/policy/model.safetensors", "data/manifest.json", "data/stats/stats.json"):
        assert (clone / path).read_bytes() == (original / path).read_bytes(), path


@pytest.fixture(scope="module")
def pushed(pipeline_repo: Path, sshd: LoopbackSshd, tmp_path_factory) -> Path:
    """The remote folder after a complete push of the pipeline's outputs over SSH."""
    folder = tmp_path_factory.mktemp("remote-full")
    add_remote(pipeline_repo, "server", sshd, folder)
    run(pipeline_repo, "dvc", "push", "-r", "server")
    return folder


def test_the_default_remote_beside_the_checkout_works_out_of_the_box(pipeline_repo: Path) -> None:
    remote = pipeline_repo.parent / "policypipe-dvc-remote"  # .dvc/config: ../../policypipe-dvc-remote
    run(pipeline_repo, "dvc", "push")
    assert len(remote_objects(remote)) == len(cache_objects(pipeline_repo))
    clone = fresh_clone(pipeline_repo, pipeline_repo.parent / "second-checkout")  # beside it: the same remote
    run(clone, "dvc", "pull")
    assert_pulled_outputs_verify(clone, pipeline_repo)


def test_push_then_pull_on_a_fresh_machine_verifies(
    pipeline_repo: Path, sshd: LoopbackSshd, pushed: Path, tmp_path: Path
) -> None:
    assert len(remote_objects(pushed)) == len(cache_objects(pipeline_repo))
    clone = fresh_clone(pipeline_repo, tmp_path / "server-checkout")
    add_remote(clone, "server", sshd, pushed)
    run(clone, "dvc", "pull", "-r", "server")
    assert_pulled_outputs_verify(clone, pipeline_repo)

    # Lineage works on the pulled copy: down to the recordings' hashes, as on the machine that ran it.
    shown = run(clone, "policypipe", "lineage", "data/policy")
    manifest = json.loads((clone / "data/manifest.json").read_text())
    for recording in manifest["recordings"]:
        for f in recording["files"].values():
            assert f"{f['sha256']}  {f['path']}" in shown


def test_an_interrupted_push_is_completed_by_the_next_push(
    pipeline_repo: Path, sshd: LoopbackSshd, tmp_path: Path
) -> None:
    folder = tmp_path / "remote-cut"
    folder.mkdir()
    total = sum(p.stat().st_size for p in cache_objects(pipeline_repo))
    proxy = CuttingProxy(sshd.port, budget=total // 3)  # the network drops a third of the way in
    try:
        add_remote(pipeline_repo, "flaky", sshd, folder, port=proxy.port)
        failed = run_failing(pipeline_repo, "dvc", "push", "-r", "flaky")
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the proxy never cut the connection: the push was not interrupted"
    assert "failed" in failed.stderr.lower()
    assert 0 < len(remote_objects(folder)) < len(cache_objects(pipeline_repo))  # part-way

    add_remote(pipeline_repo, "flaky", sshd, folder)  # the network is back
    run(pipeline_repo, "dvc", "push", "-r", "flaky")
    clone = fresh_clone(pipeline_repo, tmp_path / "checkout")
    add_remote(clone, "flaky", sshd, folder)
    run(clone, "dvc", "pull", "-r", "flaky")
    assert_pulled_outputs_verify(clone, pipeline_repo)


def test_a_pull_from_a_remote_with_a_corrupted_object_fails_loudly(
    pipeline_repo: Path, sshd: LoopbackSshd, pushed: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "remote-damaged"
    shutil.copytree(pushed, folder)
    weights = (pipeline_repo / "data/policy/model.safetensors").read_bytes()
    md5 = hashlib.md5(weights).hexdigest()
    damaged = folder / "files/md5" / md5[:2] / md5[2:]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the weights
    damaged.write_bytes(bytes(data))

    clone = fresh_clone(pipeline_repo, tmp_path / "checkout")
    add_remote(clone, "server", sshd, folder)
    failed = run_failing(clone, "dvc", "pull", "-r", "server")
    assert "ERROR" in failed.stderr and "data/policy" in failed.stderr
    assert not (
        clone / "data/policy/model.safetensors"
    ).exists()  # the damaged weights never reach the workspace
    assert run(clone, "policypipe", "verify", "data/dataset.zarr").startswith(
        "OK"
    )  # the rest was pulled intact


@pytest.fixture
def small_repo(tmp_path: Path, sshd: LoopbackSshd) -> Path:
    """A git + DVC repository with the SSH remote "server" configured by `policypipe remote add`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    add_remote(repo, "server", sshd, tmp_path / "remote")
    return repo


def test_remote_add_keeps_the_key_out_of_git(small_repo: Path, sshd: LoopbackSshd) -> None:
    committed = (small_repo / ".dvc/config").read_text()
    local = (small_repo / ".dvc/config.local").read_text()
    assert "keyfile" not in committed and str(sshd.client_key) in local
    assert 'remote "server"' in committed and "verify = true" in committed
    subprocess.run(["git", "check-ignore", "-q", ".dvc/config.local"], cwd=small_repo, check=True)
    missing = run_failing(
        small_repo, "policypipe", "remote", "add", "other", "ssh://h/x", "--keyfile", "/nonexistent/key"
    )
    assert "/nonexistent/key does not exist" in missing.stderr


@pytest.mark.parametrize("password", ["s3cret", "p%40ss"])  # %40: an '@' in the password
def test_remote_add_refuses_a_password_in_the_url(tmp_path: Path, password: str) -> None:
    # No server needed: the URL is refused before anything is written.
    repo = tmp_path / "repo"
    repo.mkdir()
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    before = {p: p.read_bytes() for p in (repo / ".dvc").rglob("*") if p.is_file()}

    refused = run_failing(
        repo, "policypipe", "remote", "add", "server", f"ssh://me:{password}@127.0.0.1/srv/dvc"
    )

    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--keyfile" in refused.stderr and "dvc remote modify --local server password" in refused.stderr
    assert ".dvc/config.local" in refused.stderr
    # The move of the password names the URL too: a local section without one breaks older revisions.
    assert "`dvc remote modify --local server url ssh://me@127.0.0.1/srv/dvc`" in refused.stderr
    assert password not in refused.stdout + refused.stderr  # not echoed to a terminal or CI log either
    assert {p: p.read_bytes() for p in (repo / ".dvc").rglob("*") if p.is_file()} == before  # nothing written


def check(repo: Path, known_hosts: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["policypipe", "remote", "check", "server", "--known-hosts", str(known_hosts)],
        cwd=repo,
        env=env(),
        capture_output=True,
        text=True,
    )


def test_remote_check_accepts_the_known_key_and_refuses_unknown_or_changed_ones(
    small_repo: Path, sshd: LoopbackSshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    done = check(small_repo, known)
    assert done.returncode == 0 and done.stdout.startswith("OK"), done.stderr

    subprocess.run(
        ["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True
    )  # hashed names
    assert "127.0.0.1" not in known.read_text()
    assert check(small_repo, known).returncode == 0

    known.write_text("")
    done = check(small_repo, known)
    assert done.returncode == 3 and "REFUSED" in done.stderr and "has no key" in done.stderr

    keygen(tmp_path / "impostor")
    algorithm, key = (tmp_path / "impostor.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {algorithm} {key}\n")
    done = check(small_repo, known)
    assert done.returncode == 3 and "CHANGED" in done.stderr, done.stderr


def metrics_repo(repo: Path) -> Path:
    """A git + DVC repository whose first commit has a metric and a plot, and no remote."""
    repo.mkdir()
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    (repo / "dvc.yaml").write_text("metrics:\n  - metrics.json\nplots:\n  - loss.csv\n")
    (repo / "metrics.json").write_text('{"loss": 1.0}\n')
    (repo / "loss.csv").write_text("step,loss\n0,1.0\n")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-q", "-m", "a metric, no remote")
    return repo


def assert_the_revision_before_the_remote_loads(repo: Path) -> None:
    """`dvc metrics diff`, `dvc plots diff` and `dvc exp show` against HEAD~1, which has no remote."""
    (repo / "metrics.json").write_text('{"loss": 0.5}\n')
    (repo / "loss.csv").write_text("step,loss\n0,0.5\n")
    done = subprocess.run(
        ["dvc", "metrics", "diff", "HEAD~1", "--json"], cwd=repo, env=env(), capture_output=True, text=True
    )
    assert done.returncode == 0 and "failed to load" not in done.stderr, done.stderr
    assert json.loads(done.stdout) == {"metrics.json": {"loss": {"old": 1.0, "new": 0.5, "diff": -0.5}}}
    plots = json.loads(run(repo, "dvc", "plots", "diff", "HEAD~1", "--json"))
    assert "errors" not in plots, plots.get("errors")
    assert sorted(plots["data"]["loss.csv"][0]["revisions"]) == ["HEAD~1", "workspace"]
    shown = json.loads(run(repo, "dvc", "exp", "show", "-n", "2", "--json"))
    older = shown[-1]  # workspace, HEAD, then HEAD~1
    assert older["error"] is None and older["data"]["metrics"]["metrics.json"]["data"] == {"loss": 1.0}


def test_remote_add_keeps_revisions_from_before_the_remote_comparable(tmp_path: Path) -> None:
    # As a new user does it (docs/lineage.md, "Remotes"): add the remote, commit, compare. No server
    # needed: nothing here connects to it.
    repo = metrics_repo(tmp_path / "repo")
    key = keygen(tmp_path / "key")
    run(
        repo,
        "policypipe",
        "remote",
        "add",
        "server",
        "ssh://me@127.0.0.1:2222/srv/dvc",
        "--keyfile",
        str(key),
    )
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-q", "-m", "the remote")
    assert str(key) not in (repo / ".dvc/config").read_text()  # the key stays out of git
    assert_the_revision_before_the_remote_loads(repo)

    from policypipe.remote import config_problems

    assert config_problems(repo) == []

    # Added again at another address, without a key: the local URL, which overrides .dvc/config's,
    # follows (a stale one would send every push to the old address).
    run(repo, "policypipe", "remote", "add", "server", "ssh://me@127.0.0.1:2223/srv/dvc")
    assert "url = ssh://me@127.0.0.1:2223/srv/dvc" in (repo / ".dvc/config.local").read_text()
    assert config_problems(repo) == []


def backticked_commands(message: str, values: dict[str, str]) -> list[list[str]]:
    """The commands a warning says to run (not its alternatives, after '; or'), with the
    placeholders filled in as the user would."""
    commands = [shlex.split(c) for c in re.findall(r"`([^`]+)`", message.split("; or")[0])]
    return [[values.get(word, word) for word in c] for c in commands]


def test_a_local_key_without_its_url_is_found_and_the_fix_it_gives_works(tmp_path: Path) -> None:
    # The layout `policypipe remote add` wrote before, and `dvc remote modify --local NAME keyfile`
    # writes on its own: URL in .dvc/config, key file alone in .dvc/config.local.
    repo = metrics_repo(tmp_path / "repo")
    run(repo, "dvc", "remote", "add", "-d", "server", "ssh://me@127.0.0.1:2222/srv/dvc")
    run(repo, "dvc", "remote", "modify", "--local", "server", "keyfile", str(keygen(tmp_path / "key")))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-q", "-m", "the remote")

    done = check(repo, tmp_path / "known_hosts")  # the warning comes before any connection
    warning = next(line for line in done.stderr.splitlines() if line.startswith("warning:"))
    assert ".dvc/config.local" in warning and "'server'" in warning and "dvc metrics diff" in warning
    (fix,) = backticked_commands(warning.split("Fix:")[1], {})
    assert fix == ["dvc", "remote", "modify", "--local", "server", "url", "ssh://me@127.0.0.1:2222/srv/dvc"]
    run(repo, *fix)
    assert "warning:" not in check(repo, tmp_path / "known_hosts").stderr
    assert_the_revision_before_the_remote_loads(repo)


def test_a_local_section_for_a_remote_nowhere_else_is_explained_not_a_traceback(tmp_path: Path) -> None:
    # Left behind, e.g., when the remote was removed from .dvc/config by hand: DVC refuses the
    # whole config, at every revision.
    repo = tmp_path / "repo"
    repo.mkdir()
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    (repo / ".dvc/config.local").write_text("['remote \"ghost\"']\n    keyfile = /home/me/.ssh/id_ed25519\n")
    done = check(repo, tmp_path / "known_hosts")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "warning: .dvc/config.local sets keyfile for remote 'ghost', which has no URL" in done.stderr
    assert "`dvc remote remove --local ghost`" in done.stderr
    assert "error: the DVC config (.dvc/config merged with .dvc/config.local) is invalid" in done.stderr


def test_secrets_in_dvc_config_are_warned_of_never_printed_and_the_moves_given_work(
    tmp_path: Path, sshd: LoopbackSshd
) -> None:
    repo = metrics_repo(tmp_path / "repo")
    folder = tmp_path / "remote"
    secrets = {  # (remote, placeholder in the warning): the secret
        ("server", "PASSWORD"): "url-s3cret",
        ("server", "PASSPHRASE"): "phrase-s3cret",
        ("backup", "PASSWORD"): "option-s3cret",
        ("cloud", "SECRET_ACCESS_KEY"): "aws-s3cret",
    }
    # Set as DVC's own commands set them, without --local: into .dvc/config, which git tracks.
    run(
        repo,
        "dvc",
        "remote",
        "add",
        "-d",
        "server",
        f"ssh://{sshd.user}:url-s3cret@127.0.0.1:{sshd.port}{folder}",
    )
    run(repo, "dvc", "remote", "modify", "server", "passphrase", "phrase-s3cret")
    run(repo, "dvc", "remote", "add", "backup", url(sshd, folder))
    run(repo, "dvc", "remote", "modify", "backup", "password", "option-s3cret")
    run(repo, "dvc", "remote", "add", "cloud", "s3://bucket/policypipe")
    run(repo, "dvc", "remote", "modify", "cloud", "secret_access_key", "aws-s3cret")
    run(repo, "dvc", "remote", "modify", "--local", "cloud", "url", "s3://bucket/policypipe")
    run(repo, "dvc", "remote", "modify", "--local", "cloud", "session_token", "local-s3cret")  # fine: ignored
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-q", "-m", "secrets, committed")
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())

    done = check(repo, known)
    printed = done.stdout + done.stderr
    assert done.returncode == 0 and done.stdout.startswith("OK"), printed  # warnings do not refuse
    for secret in [*secrets.values(), "local-s3cret"]:
        assert secret not in printed
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 4, warnings  # the URL's password, passphrase, password, secret_access_key
    starts = {
        ("server", "url"): "warning: the URL of remote 'server' in .dvc/config",
        ("server", "passphrase"): "warning: remote 'server' has its passphrase",
        ("backup", "password"): "warning: remote 'backup' has its password",
        ("cloud", "secret_access_key"): "warning: remote 'cloud' has its secret_access_key",
    }
    for (remote, option), start in starts.items():
        (hit,) = [w for w in warnings if w.startswith(start)]
        assert ".dvc/config, which git tracks" in hit and "git's history already" in hit
        if option != "url":
            assert f"`dvc remote modify --local {remote} {option} {option.upper()}`" in hit
            assert f"`dvc remote modify --unset {remote} {option}`" in hit
    assert f"ssh://{sshd.user}:****@127.0.0.1:{sshd.port}{folder}" in printed

    # Do as told: the secrets end up in .dvc/config.local only, and no warning is left.
    for warning in warnings:
        for command in backticked_commands(warning, {}):
            remote = next(word for word in command[3:] if not word.startswith("--"))
            run(repo, *[secrets.get((remote, word), word) for word in command])
    committed, local = (repo / ".dvc/config").read_text(), (repo / ".dvc/config.local").read_text()
    for secret in secrets.values():
        assert secret not in committed and secret in local
    done = check(repo, known)
    assert done.returncode == 0 and "warning:" not in done.stderr, done.stderr
    assert_the_revision_before_the_remote_loads(repo)  # HEAD~1, with no remote: the moves kept it loadable


def test_mask_url_hides_only_the_password() -> None:
    from policypipe.remote import mask_url

    assert mask_url("ssh://me:p%40ss@host:2222/srv/dvc") == "ssh://me:****@host:2222/srv/dvc"
    assert mask_url("https://me:pw@host/x") == "https://me:****@host/x"
    assert mask_url("ssh://me@host/srv/dvc") == "ssh://me@host/srv/dvc"


def test_every_secret_option_is_one_dvc_knows() -> None:
    from dvc.config_schema import REMOTE_SCHEMAS

    from policypipe.remote import SECRET_OPTIONS

    known = {option for schema in REMOTE_SCHEMAS.values() for option in schema if isinstance(option, str)}
    assert set(SECRET_OPTIONS) <= known
