"""Who may connect: loopback without a token by default; any other address only with one.

The token travels in the opening handshake's Authorization header, as `Bearer TOKEN` or as
openpi's clients send it, `Api-Key TOKEN`, and is compared in constant time. It is read from a
file (never a command-line argument, which other users see in `ps`) and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
MAKE_TOKEN = (
    "python -c 'import secrets; print(secrets.token_urlsafe(32))' > TOKEN_FILE && chmod 600 TOKEN_FILE"
)
SCHEMES = ("bearer", "api-key")
WHITESPACE_NAMES = {" ": "a space", "\t": "a tab", "\n": "a line break", "\r": "a carriage return"}


class AccessError(ValueError):
    """A server set up to be reachable without protection, or a token that cannot protect it."""


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host`: 127.0.0.0/8, ::1 or `localhost`. A host name that
    resolves to loopback counts as reachable from elsewhere: what it resolves to can change."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path) -> str:
    path = Path(path).expanduser()
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessError(f"cannot read the token file {path}: {exc}") from None
    # The header carries `Bearer TOKEN`: whitespace inside a token would split it (and a tab or a
    # newline inside one is a file written wrong, not a secret).
    whitespace = sorted({WHITESPACE_NAMES.get(c, f"U+{ord(c):04X}") for c in token if c.isspace()})
    if len(token) < MIN_TOKEN_CHARS or whitespace:
        problems = ([f"only {len(token)} characters"] if len(token) < MIN_TOKEN_CHARS else []) + (
            [f"whitespace inside it ({', '.join(whitespace)})"] if whitespace else []
        )
        raise AccessError(
            f"the token in {path} has {' and '.join(problems)}: use one of at least {MIN_TOKEN_CHARS} "
            f"characters and no whitespace, e.g. `{MAKE_TOKEN}`"
        )
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("the token file %s is readable by other users: chmod 600 %s", path, path)
    return token


def require_token_for(host: str, token: str | None) -> None:
    """Refuses, before anything is loaded or bound, to serve beyond loopback without a token."""
    if token is None and not is_loopback(host):
        raise AccessError(
            f"--host {host} lets other machines reach the policy, so it needs a token: pass "
            f"--token-file TOKEN_FILE (made with `{MAKE_TOKEN}`), and give the robot the same token; "
            "or serve on 127.0.0.1 and reach it through an SSH tunnel"
        )


def authorized(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries the token (Bearer or Api-Key), in constant time."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() not in SCHEMES:
        given = ""
    return hmac.compare_digest(given.strip().encode(), token.encode())
