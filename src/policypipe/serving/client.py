"""The robot side of `policypipe serve`: `PolicyClient(url, token).act(observation)` returns the
chunk `PolicyRunner.act` would, computed on the server (docs/serving.md). NumPy, msgpack and
websockets only: no torch on the robot's computer.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from policypipe.runtime.observation import ObservationError
from policypipe.serving.protocol import (
    CONTROL,
    OBSERVATION,
    RequestError,
    ServedChunk,
    act_message,
    chunk_from_message,
    pack,
    parse_error,
    unpack,
)

DEFAULT_URL = "ws://127.0.0.1:8000"
MAX_REPLY_BYTES = 16 * 2**20  # a chunk is a few kilobytes, the metadata a few more


class PolicyServerError(RuntimeError):
    """The server's error reply (`code` as in docs/serving.md), or a connection that ended."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RemoteObservationError(PolicyServerError, ObservationError):
    """The server's runner refused the observation: caught as ObservationError, as in process."""


class PolicyClient:
    """One connection to a policy server; requests are answered in order, one at a time.

    `timeout_s` bounds every wait (connecting, each reply): a robot loop must not hang on a server
    that went away. After a timeout the connection is closed, since a late reply would otherwise
    be taken for the next request's; connect again."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        token_file: Path | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        if token_file is not None:
            token = Path(token_file).expanduser().read_text().strip()
        self.url, self.timeout_s = url, timeout_s
        self._stack = ExitStack()  # websockets wants its connection used as a context manager
        try:
            self._ws = self._stack.enter_context(
                connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {token}"} if token else None,
                    compression=None,
                    max_size=MAX_REPLY_BYTES,
                    open_timeout=timeout_s,
                    close_timeout=timeout_s,
                )
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = (exc.response.body or b"").decode(errors="replace").strip()
            raise PolicyServerError(
                "unauthorized" if status == 401 else f"http_{status}",
                f"{url} refused the connection (HTTP {status}: {body})",
            ) from None
        # The server's first message, as with openpi's server: which policy answers.
        try:
            self.metadata: dict[str, Any] = self._receive()
        except BaseException:
            self.close()
            raise

    def act(
        self,
        observation: Any,
        *,
        now_ns: int | None = None,
        seed: int | None = None,
        episode_start_ns: int | None = None,
    ) -> ServedChunk:
        """`observation`: an Observation, or a mapping of its seven arrays (frame_ns, frames, ...)."""
        return chunk_from_message(self.request(act_message(observation, now_ns, seed, episode_start_ns)))

    def request_metadata(self) -> dict[str, Any]:
        return self.request({CONTROL: "metadata"})

    def health(self) -> dict[str, Any]:
        return self.request({CONTROL: "health"})

    def request(self, message: dict[str, Any]) -> Any:
        """One request, its decoded reply; an error reply raises PolicyServerError."""
        self._send(pack(message))
        return self._receive()

    def _send(self, data: bytes) -> None:
        try:
            self._ws.send(data)
        except ConnectionClosed as exc:
            raise self._closed(exc) from None

    def _receive(self) -> Any:
        try:
            reply = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()
            raise TimeoutError(
                f"no reply from {self.url} within {self.timeout_s} s: the connection is closed, connect again"
            ) from None
        except ConnectionClosed as exc:
            raise self._closed(exc) from None
        if isinstance(reply, str):
            code, message = parse_error(reply)
            raise (RemoteObservationError if code == OBSERVATION else PolicyServerError)(code, message)
        try:
            return unpack(reply)
        except RequestError as exc:
            raise PolicyServerError("bad_reply", f"the server's reply cannot be read: {exc}") from None

    def _closed(self, exc: ConnectionClosed) -> PolicyServerError:
        close = exc.rcvd
        how = f"{close.code} {close.reason}".strip() if close is not None else "without a close frame"
        return PolicyServerError("closed", f"{self.url} closed the connection ({how}): connect again")

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
