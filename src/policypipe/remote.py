"""DVC remotes: setting up an SSH remote, and the host-key check that dvc-ssh does not make.

dvc-ssh connects without checking the server's host key, so a push could go to whoever
answers at that address. `check_host_key` compares the key the server presents with the
user's `known_hosts` and refuses an unknown or changed key; `policypipe remote check` runs
it for a configured remote before a push.

Secrets stay out of git: the remote's URL and `verify = true` go to `.dvc/config` (committed),
the key file's path to `.dvc/config.local` (ignored by git); a URL with a password is refused.
`config.local` gets the URL as well: DVC reads an older revision's `.dvc/config` from git but
`config.local` from the workspace, and a local section without a URL, merged with a revision
that has no such remote, is an invalid config: `dvc metrics diff`, `dvc plots diff` and
`dvc exp show` then fail to load every revision from before the remote was added.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_SSH_PORT = 22
# An RSA host key is offered under these signature algorithms (current servers refuse ssh-rsa).
RSA_SIGNATURES = {"ssh-rsa": ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]}


class RemoteError(Exception):
    """A remote cannot be set up or checked; the message says what to do."""


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str | None
    path: str


def parse_ssh_url(url: str) -> SshTarget:
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname or not parts.path:
        raise RemoteError(f"{url!r} is not an SSH remote URL: use ssh://[user@]host[:port]/absolute/path")
    return SshTarget(parts.hostname, parts.port or DEFAULT_SSH_PORT, parts.username, parts.path)


def run_dvc(repo: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise RemoteError(f"dvc {' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def add_ssh_remote(
    repo: Path, name: str, url: str, keyfile: Path | None, *, default: bool = True
) -> SshTarget:
    """`dvc remote add` with downloads verified, and the key file (with the URL) in the git-ignored
    local config."""
    if urlsplit(url).password is not None:
        # The URL goes to .dvc/config, which is committed: a password in it would be in git's
        # history for good. Checked before the URL is parsed, whose errors quote it: the password
        # is not echoed to a terminal or a CI log either.
        raise RemoteError(
            "the URL holds a password, and the URL is written to .dvc/config, which git tracks. Remove the "
            "password from the URL and authenticate with a key file (--keyfile PATH), "
            "or keep the password out of "
            f"git with `dvc remote modify --local {name} password ...`, "
            "which writes .dvc/config.local (ignored by git)"
        )
    target = parse_ssh_url(url)
    if keyfile is not None:
        keyfile = Path(keyfile).expanduser().resolve()
        if not keyfile.is_file():
            raise RemoteError(f"key file {keyfile} does not exist: create one with `ssh-keygen -t ed25519`")
    run_dvc(repo, "remote", "add", "--force", *(["--default"] if default else []), name, url)
    # Hash every object a pull downloads: a corrupted object then fails the pull instead of
    # landing silently in the cache and the workspace.
    run_dvc(repo, "remote", "modify", name, "verify", "true")
    # The local section gets the URL too, so that it is a whole remote by itself: merged with an
    # older revision's .dvc/config, which lacks this remote, it still validates (see the module's
    # docstring). Also where the local section is there from an earlier `remote add`: its URL
    # overrides .dvc/config's, and must not keep pointing at the old one.
    if keyfile is not None or name in _level_remotes(repo, "local"):
        run_dvc(repo, "remote", "modify", "--local", name, "url", url)
    if keyfile is not None:
        run_dvc(repo, "remote", "modify", "--local", name, "keyfile", str(keyfile))
    return target


def remote_settings(repo: Path, name: str | None) -> tuple[str, dict[str, Any]]:
    """(name, settings) of a configured remote, all config levels merged; the default one if no name."""
    from dvc.config import Config

    config = Config(dvc_dir=str(Path(repo) / ".dvc"))
    name = name or config["core"].get("remote")
    if not name:
        raise RemoteError("no default remote: name one, or add one with `policypipe remote add`")
    if name not in config["remote"]:
        raise RemoteError(f"no remote named {name!r}; configured: {', '.join(config['remote']) or 'none'}")
    return name, dict(config["remote"][name])


def _level_remotes(repo: Path, level: str) -> dict[str, dict[str, Any]]:
    """The remote sections of one config file ("repo": .dvc/config, "local": .dvc/config.local),
    as written: not merged, not validated (a broken layout is what the caller looks for)."""
    from dvc.config import Config

    config = Config(dvc_dir=str(Path(repo).resolve() / ".dvc"), validate=False)
    return config.load_one(level)["remote"]


@dataclass(frozen=True)
class HostKeyCheck:
    status: str  # "ok", "unknown" or "changed"
    host: str
    port: int
    presented: str  # the server's key: algorithm and SHA256 fingerprint
    known: list[str]  # what known_hosts holds for this host

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def message(self, known_hosts: Path) -> str:
        where = self.host if self.port == DEFAULT_SSH_PORT else f"[{self.host}]:{self.port}"
        if self.ok:
            return f"OK {where}: host key {self.presented} matches {known_hosts}"
        if self.status == "unknown":
            return (
                f"REFUSED {where}: {known_hosts} has no key for this host; "
                f"the server presents {self.presented}.\n"
                "Compare that fingerprint with the server's own (on the server: "
                "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), "
                "then add the key by connecting once with "
                f"`ssh -p {self.port} {self.host}` and answering yes."
            )
        return (
            f"REFUSED {where}: THE HOST KEY HAS CHANGED. "
            f"{known_hosts} has {', '.join(self.known)}; the server presents "
            f"{self.presented}.\nSomeone may be intercepting the connection, "
            "or the server was reinstalled. Ask its "
            "admin; only if the change is expected, "
            f"remove the old key with `ssh-keygen -R '{where}'` and check again."
        )


def check_host_key(host: str, port: int, known_hosts: Path, timeout_s: float = 15.0) -> HostKeyCheck:
    """Compares the server's host key with `known_hosts` (hashed entries and [host]:port included)."""
    import asyncssh

    try:
        known = asyncssh.read_known_hosts(str(known_hosts)) if Path(known_hosts).is_file() else None
    except (OSError, ValueError) as exc:
        raise RemoteError(f"cannot read {known_hosts}: {exc}") from exc
    addr = _resolve(host)
    # The host name and its address may match the same entry: one key each.
    trusted = list({k.public_data: k for k in known.match(host, addr, port)[0]}.values()) if known else []

    async def presented_key(algorithms: list[str] | tuple[()]) -> Any:
        return await asyncio.wait_for(
            asyncssh.get_server_host_key(host, port, server_host_key_algs=algorithms), timeout_s
        )

    # Ask for the kinds of key known_hosts holds, as OpenSSH does: a server has several host keys.
    # A server that offers none of them drops the connection; asked for any kind, the key it then
    # presents is a changed one.
    algorithms = sorted(
        {alg for k in trusted for alg in RSA_SIGNATURES.get(k.get_algorithm(), [k.get_algorithm()])}
    )
    key = None
    for kinds in ([algorithms] if algorithms else []) + [()]:
        try:
            key = asyncio.run(presented_key(kinds))
            break
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            failure = exc
    if key is None:
        raise RemoteError(f"cannot reach {host}:{port} to read its host key: {failure}")
    known_desc = [describe(k) for k in trusted]
    if not trusted:
        return HostKeyCheck("unknown", host, port, describe(key), known_desc)
    matches = any(k.public_data == key.public_data for k in trusted)
    return HostKeyCheck("ok" if matches else "changed", host, port, describe(key), known_desc)


def describe(key: Any) -> str:
    """An SSH public key as `ssh-keygen -l` shows it: algorithm and SHA256 fingerprint."""
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


def _resolve(host: str) -> str:
    import socket

    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except OSError as exc:
        raise RemoteError(f"cannot resolve {host}: {exc}") from exc
