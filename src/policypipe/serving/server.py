"""The policy server: one PolicyRunner behind a websocket (docs/serving.md).

A connection gets the policy's metadata first (as openpi's server does), then answers each request
in order: an act request with an action chunk, a control request (metadata, health) with a map,
anything else with an error reply, after which the connection stays open. Acts run on one worker
thread, one at a time (one model, one noise generator), and requests other than the smallest
(control requests) are decoded on other threads, so that the event loop keeps answering metadata
and health requests, and handshakes, while a chunk is being computed or a request decoded. On
SIGTERM or SIGINT the server stops accepting, drops the connections that never finished their
opening handshake, lets the acts in flight reply, and closes every connection with 1001 (going away).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.protocol import State

from policypipe.runtime.observation import Observation, ObservationError
from policypipe.serving.access import authorized, read_token, require_token_for
from policypipe.serving.protocol import (
    INTERNAL,
    NOT_MSGPACK,
    OBSERVATION,
    TOO_LARGE,
    ActRequest,
    Control,
    RequestError,
    chunk_message,
    decode_request,
    error_text,
    pack,
)

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20
# websockets refuses a message longer than its max_size from the frame's header, before reading
# it, and must then close the connection (the unread bytes are still in the stream). So it gets
# twice the request limit: a request up to that is read and refused with an error reply, the
# connection staying open; only beyond it is the connection closed (1009, message too big).
TRANSPORT_FACTOR = 2
# Messages a connection buffers before websockets stops reading from its socket: a client that
# sends without waiting for replies is slowed down, not given the server's memory.
MAX_QUEUE = 2
# A message up to this size (a control request: 20 bytes) decodes on the event loop, in well under a
# millisecond whatever it holds; a larger one on a decoding thread, so that no request's decoding
# delays another connection's reply.
INLINE_DECODE_BYTES = 256
DECODE_THREADS = 2
SHUTDOWN_GRACE_S = 10.0
HEALTH_PATH = "/healthz"


def ws_url(host: str, port: int) -> str:
    """ws://host:port, an IPv6 address in brackets (ws://[::1]:8000)."""
    return f"ws://{'[' + host + ']' if ':' in host else host}:{port}"


class PolicyServer:
    """`runner`: a PolicyRunner (anything with its `act`); `metadata`: what a client is sent on
    connecting and on a metadata request (serving.metadata.policy_metadata)."""

    def __init__(
        self,
        runner: Any,
        metadata: dict[str, Any],
        token: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        if max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be positive, got {max_request_bytes}")
        self.runner = runner
        self.metadata = metadata
        self.token = token
        self.max_request_bytes = max_request_bytes
        self._metadata_message = pack(metadata)
        self._connections: set[ServerConnection] = set()
        # Every TCP connection accepted, the handshake finished or not (it lives while websockets
        # holds it): those still opening are dropped at shutdown, not waited for.
        self._accepted: weakref.WeakSet[ServerConnection] = weakref.WeakSet()
        self._busy: set[ServerConnection] = set()
        self._closing = False
        self._started = time.monotonic()
        self.counts = {"served": 0, "errors": 0, "pending": 0}

    async def run(
        self,
        host: str,
        port: int,
        stop: asyncio.Event,
        on_listening: Callable[[str, int], None] | None = None,
    ) -> None:
        """Serves until `stop` is set; `on_listening(host, port)` once bound (port 0: the one the
        system chose)."""
        require_token_for(host, self.token)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policypipe-act")
        decoders = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="policypipe-decode")
        try:
            async with serve(
                lambda ws: self._handle(ws, executor, decoders),
                host,
                port,
                create_connection=self._accept,
                process_request=self._process_request,
                compression=None,  # arrays compress poorly and the CPU is the policy's
                max_size=self.max_request_bytes * TRANSPORT_FACTOR,
                max_queue=MAX_QUEUE,
                # Browsers send an Origin header, robot clients do not: a web page cannot drive the
                # robot through a server on loopback (cross-site websocket hijacking).
                origins=[None],
            ) as server:
                bound = server.sockets[0].getsockname()
                logger.info("serving on %s", ws_url(bound[0], bound[1]))
                if on_listening is not None:
                    on_listening(bound[0], bound[1])
                await stop.wait()
                await self._shut_down(server, executor)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
            decoders.shutdown(wait=True, cancel_futures=True)

    def _accept(self, *args: Any, **kwargs: Any) -> ServerConnection:
        """websockets' connection factory: each TCP connection, as it is accepted."""
        connection = ServerConnection(*args, **kwargs)
        self._accepted.add(connection)
        return connection

    def _process_request(self, connection: ServerConnection, request: Any) -> Any:
        """The opening handshake: the health check, then the token."""
        if request.path.split("?", 1)[0] == HEALTH_PATH:
            return connection.respond(HTTPStatus.OK, "OK\n")
        if self.token is not None:
            headers = request.headers.get_all("Authorization")
            if len(headers) != 1 or not authorized(headers[0], self.token):
                logger.warning("refused a connection from %s: no or a wrong token", connection.remote_address)
                return connection.respond(
                    HTTPStatus.UNAUTHORIZED,
                    "this server needs its token: send the header 'Authorization: Bearer TOKEN'\n",
                )
        return None

    async def _handle(
        self, ws: ServerConnection, executor: ThreadPoolExecutor, decoders: ThreadPoolExecutor
    ) -> None:
        self._connections.add(ws)
        logger.info("connection from %s", ws.remote_address)
        try:
            await ws.send(self._metadata_message)
            async for message in ws:
                self._busy.add(ws)
                try:
                    reply = await self._answer(message, executor, decoders)
                finally:
                    self._busy.discard(ws)
                await ws.send(reply)
                if self._closing:
                    await ws.close(CloseCode.GOING_AWAY, "server shutting down")
                    break
        except ConnectionClosed:
            pass
        finally:
            self._connections.discard(ws)
            logger.info("connection from %s closed", ws.remote_address)

    async def _answer(
        self, message: bytes | str, executor: ThreadPoolExecutor, decoders: ThreadPoolExecutor
    ) -> bytes | str:
        """The reply to one message: never an exception, never a traceback."""
        try:
            if isinstance(message, str):
                raise RequestError(
                    NOT_MSGPACK, "a text frame: send each request as one binary frame of msgpack"
                )
            if len(message) > self.max_request_bytes:
                raise RequestError(
                    TOO_LARGE,
                    f"the request has {len(message)} bytes, this server takes up to {self.max_request_bytes} "
                    "(serve --max-request-mb): send fewer or smaller camera frames",
                )
            if len(message) <= INLINE_DECODE_BYTES:
                request = decode_request(message)
            else:
                request = await asyncio.get_running_loop().run_in_executor(decoders, decode_request, message)
            if isinstance(request, Control):
                return pack(self._control(request.name))
            self.counts["pending"] += 1
            try:
                chunk, infer_ms = await asyncio.get_running_loop().run_in_executor(
                    executor, self._act, request
                )
            finally:
                self.counts["pending"] -= 1
            self.counts["served"] += 1
            return pack(chunk_message(chunk, infer_ms))
        except RequestError as exc:
            return self._error(exc.code, str(exc))
        except ObservationError as exc:
            return self._error(OBSERVATION, str(exc))
        except Exception:
            logger.exception("a request failed inside the server")
            return self._error(INTERNAL, "the server failed on this request (its log has the details)")

    def _act(self, request: ActRequest) -> tuple[Any, float]:
        """On the worker thread."""
        started = time.perf_counter()
        chunk = self.runner.act(
            Observation.checked(**request.observation),
            now_ns=request.now_ns,
            seed=request.seed,
            episode_start_ns=request.episode_start_ns,
        )
        return chunk, (time.perf_counter() - started) * 1e3

    def _control(self, name: str) -> dict[str, Any]:
        if name == "metadata":
            return self.metadata
        if name == "health":
            return {
                "status": "ok",
                "busy": self.counts["pending"] > 0,
                **self.counts,
                "uptime_s": round(time.monotonic() - self._started, 3),
            }
        return {"__ack__": name}  # openpi's episode_start, episode_end

    def _error(self, code: str, message: str) -> str:
        self.counts["errors"] += 1
        logger.info("error reply %s: %s", code, message[:200])
        return error_text(code, message)

    async def _shut_down(self, server: Any, executor: ThreadPoolExecutor) -> None:
        self._closing = True
        server.close(close_connections=False)  # no new connections; those computing reply first
        # A client that connected but never sent its handshake would hold the shutdown until its
        # open timeout; it has no request to answer, so it is dropped.
        opening = [ws for ws in self._accepted if ws.protocol.state is State.CONNECTING]
        for ws in opening:
            ws.transport.abort()
        if opening:
            logger.info("connections that never finished their opening handshake, dropped: %d", len(opening))
        idle = [ws for ws in self._connections if ws not in self._busy]
        await asyncio.gather(
            *(ws.close(CloseCode.GOING_AWAY, "server shutting down") for ws in idle), return_exceptions=True
        )
        try:
            await asyncio.wait_for(server.wait_closed(), SHUTDOWN_GRACE_S)
        except asyncio.TimeoutError:
            if self._busy:
                logger.warning(
                    "%d requests still in flight after %.0f s: closing their connections",
                    len(self._busy),
                    SHUTDOWN_GRACE_S,
                )
            else:  # a client that reads no reply, a close handshake never answered
                logger.warning(
                    "connections still open after %.0f s, none with a request in flight: closing them",
                    SHUTDOWN_GRACE_S,
                )
            executor.shutdown(wait=False, cancel_futures=True)
            await asyncio.gather(
                *(ws.close(CloseCode.GOING_AWAY, "server shutting down") for ws in list(self._connections)),
                return_exceptions=True,
            )


class ServerThread:
    """A PolicyServer on its own event loop in a background thread (tests, benchmarks, a program
    that serves besides other work); `with ServerThread(server) as running: running.url`."""

    def __init__(self, server: PolicyServer, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.server, self.host, self.port = server, host, port
        self.url: str | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="policypipe-server")

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.server.run(self.host, self.port, self._stop, self._listening)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()

    def _listening(self, host: str, port: int) -> None:
        self.port = port
        self.url = ws_url(host, port)
        self._ready.set()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        if self._failure is not None:
            raise self._failure


def serve_policy(
    folder: Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token_file: Path | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    threads: int | None = None,
    on_listening: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> str:
    """`policypipe serve`: the policy in `folder` until SIGTERM or SIGINT, whose name it returns.
    Everything that can be refused (the token, the bind address, the policy) is, before binding.
    `threads`: torch's intra-op threads for the acts (None: torch's default, one per core)."""
    import torch

    from policypipe.runtime.runner import PolicyRunner
    from policypipe.serving.metadata import policy_metadata

    if max_request_bytes < 1:
        raise ValueError(f"the request limit must be positive, got {max_request_bytes} bytes")
    token = read_token(token_file) if token_file is not None else None
    require_token_for(host, token)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        # On a computer shared with the robot's own processes, fewer threads than cores can be
        # faster: torch's threads wait for each other when one of them is descheduled.
        torch.set_num_threads(threads)
    runner = PolicyRunner.load(folder)
    if runner.policy.config.remember_release:
        # Its runner keeps one episode's start; a server's clients would overwrite each other's.
        raise ValueError(
            f"policy {folder} remembers its episode's start (remember_release), which the server does "
            "not keep per client yet: run it in process (policypipe.runtime.runner.PolicyRunner)"
        )
    server = PolicyServer(
        runner, policy_metadata(folder, runner.spec.to_json(), max_request_bytes), token, max_request_bytes
    )

    async def main() -> str:
        stop, received = asyncio.Event(), []
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: (received.append(s.name), stop.set()))
        listening = None if on_listening is None else lambda h, p: on_listening(h, p, server.metadata)
        await server.run(host, port, stop, listening)
        return received[0]

    return asyncio.run(main())
