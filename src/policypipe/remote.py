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
`config_problems` finds a secret in `.dvc/config` and such a local section in a repository set
up otherwise, and says how to fix each; nothing here prints a secret (`mask_url`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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
        raise RemoteError(
            f"{mask_url(url)!r} is not an SSH remote URL: use ssh://[user@]host[:port]/absolute/path"
        )
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
        # history for good. The message shows the URL without it: the password is not echoed to a
        # terminal or a CI log either. Its move to config.local names the URL too: a local section
        # without one breaks older revisions (see the module's docstring).
        clean = _without_password(url, None)
        raise RemoteError(
            "the URL holds a password, and the URL is written to .dvc/config, which git tracks. Remove the "
            f"password from the URL and authenticate with a key file: `policypipe remote add {name} {clean} "
            "--keyfile PATH`; or keep the password in .dvc/config.local (ignored by git): "
            + _commands(
                f"policypipe remote add {name} {clean}",
                f"dvc remote modify --local {name} url {clean}",
                f"dvc remote modify --local {name} password PASSWORD",
            )
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
    from dvc.config import Config, ConfigError

    try:
        config = Config(dvc_dir=str(Path(repo) / ".dvc"))
    except ConfigError as exc:
        raise RemoteError(
            f"the DVC config (.dvc/config merged with .dvc/config.local) is invalid: {exc}"
        ) from exc
    name = name or config["core"].get("remote")
    if not name:
        raise RemoteError("no default remote: name one, or add one with `policypipe remote add`")
    if name not in config["remote"]:
        raise RemoteError(f"no remote named {name!r}; configured: {', '.join(config['remote']) or 'none'}")
    return name, dict(config["remote"][name])


# Options that hold a credential, in any of DVC's remote types (dvc/config_schema.py). Not among
# them: keyfile (a path to a key, not the key) and the ask_* switches (booleans).
SECRET_OPTIONS = (
    "password",
    "passphrase",
    "token",
    "secret_access_key",
    "session_token",
    "sse_customer_key",
    "account_key",
    "sas_token",
    "connection_string",
    "client_secret",
    "oss_key_secret",
    "gdrive_client_secret",
)
MASK = "****"


def _without_password(url: str, replacement: str | None) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    return urlunsplit(
        parts._replace(netloc=f"{user}{'' if replacement is None else ':' + replacement}@{host}")
    )


def mask_url(url: str) -> str:
    """The URL as it may be shown: a password in it replaced by ****."""
    return _without_password(url, MASK)


def _level_remotes(repo: Path, level: str) -> dict[str, dict[str, Any]]:
    """The remote sections of one config file ("repo": .dvc/config, "local": .dvc/config.local),
    as written: not merged, not validated (a broken layout is what the caller looks for)."""
    from dvc.config import Config

    config = Config(dvc_dir=str(Path(repo).resolve() / ".dvc"), validate=False)
    return config.load_one(level)["remote"]


def _committed(repo: Path, key: str, value: str) -> bool:
    """Whether a commit's .dvc/config ever had `key = value` (git's output searched here: the
    secret is never passed in git's arguments, which other users can see in the process list)."""
    done = subprocess.run(
        ["git", "log", "--all", "-p", "--format=", "--", ".dvc/config"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    added = (line for line in done.stdout.splitlines() if line.startswith("+"))
    return done.returncode == 0 and any(key in line and value in line for line in added)


def _history_note(repo: Path, key: str, value: str, what: str) -> str:
    if _committed(repo, key, value):
        return (
            f" It is in git's history already, and moving it does not take it out: change the {what} "
            "itself too."
        )
    return " It is not committed yet: move it before the next commit."


def _commands(*commands: str) -> str:
    return ", then ".join(f"`{c}`" for c in commands)


def config_problems(repo: Path) -> list[str]:
    """What in the repository's DVC config puts a secret in git, or breaks comparisons with older
    revisions; each message names the file, the remote and the option, and gives the commands that
    fix it. No secret is in the messages."""
    repo = Path(repo)
    committed, local = _level_remotes(repo, "repo"), _level_remotes(repo, "local")
    problems = []
    for name, section in committed.items():
        url = str(section.get("url", ""))
        clean = _without_password(url, None)
        # A secret moved to a local section without a URL would break every revision from before
        # the remote was added (see the module's docstring): the URL goes there first.
        to_local = [] if "url" in local.get(name, {}) else [f"dvc remote modify --local {name} url {clean}"]
        password = urlsplit(url).password
        if password is not None:
            problems.append(
                f"the URL of remote {name!r} in .dvc/config, which git tracks, holds a password "
                f"({mask_url(url)}). Take it out and keep the password in .dvc/config.local, which git "
                "ignores: "
                + _commands(
                    f"dvc remote modify {name} url {clean}",
                    *to_local,
                    f"dvc remote modify --local {name} password PASSWORD",
                )
                + (
                    f"; or use a key instead: `policypipe remote add {name} {clean} --keyfile KEY`"
                    if url.startswith("ssh://")
                    else ""
                )
                + "."
                + _history_note(repo, "url", url, "password")
            )
        for option in SECRET_OPTIONS:
            if option not in section:
                continue
            ask = _ask_option(url, option)
            problems.append(
                f"remote {name!r} has its {option} ({MASK}) in .dvc/config, which git tracks. Move it to "
                ".dvc/config.local, which git ignores: "
                + _commands(
                    *to_local,
                    f"dvc remote modify --local {name} {option} {option.upper()}",
                    f"dvc remote modify --unset {name} {option}",
                )
                + (
                    f"; or have it asked for at each push: `dvc remote modify {name} {ask} true`"
                    if ask
                    else ""
                )
                + "."
                + _history_note(repo, option, str(section[option]), option)
            )
    for name, section in local.items():
        shared = committed.get(name, {}).get("url")
        if "url" in section:
            mine = str(section["url"])
            if shared is not None and _without_password(mine, None) != _without_password(str(shared), None):
                problems.append(
                    f"remote {name!r} has the URL {mask_url(mine)} in .dvc/config.local, which overrides "
                    f"{mask_url(str(shared))} in .dvc/config: DVC uses the local one. If the shared one is "
                    f"right: `dvc remote modify --local {name} url {_without_password(str(shared), None)}`."
                )
            continue
        options = ", ".join(sorted(section)) or "no option"
        if shared is None:
            problems.append(
                f".dvc/config.local sets {options} for remote {name!r}, which has no URL in .dvc/config "
                f"either, and DVC refuses the config: give it one (`dvc remote modify --local {name} url "
                f"URL`) or remove it (`dvc remote remove --local {name}`)."
            )
        else:
            problems.append(
                f".dvc/config.local sets {options} for remote {name!r} but not its URL. DVC merges "
                "config.local with each revision's .dvc/config, so every revision from before the remote "
                "was added fails to load (`dvc metrics diff`, `dvc plots diff`, `dvc exp show`). Fix: "
                f"`dvc remote modify --local {name} url {_without_password(str(shared), None)}`."
            )
    return problems


def _ask_option(url: str, option: str) -> str | None:
    """`ask_password`/`ask_passphrase` where the remote's type has it: asked for, never stored."""
    from dvc.config_schema import REMOTE_SCHEMAS

    ask = f"ask_{option}"
    return ask if ask in REMOTE_SCHEMAS.get(urlsplit(url).scheme, {}) else None


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
