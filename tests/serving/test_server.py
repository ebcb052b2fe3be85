"""The server in process on loopback, driven by real websocket clients: ours, openpi-style raw ones,
and hostile ones."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from policypipe.atomic import MANIFEST
from policypipe.runtime.observation import Observation, ObservationError
from policypipe.runtime.spec import RuntimeSpec
from policypipe.serving.access import AccessError
from policypipe.serving.client import PolicyClient, PolicyServerError, RemoteObservationError
from policypipe.serving.protocol import CHUNK_FIELDS, act_message, pack
from policypipe.serving.server import PolicyServer, ServerThread
from tests.serving.conftest import MAX_REQUEST_BYTES, serving
from tests.serving.test_protocol import openpi_packb

TOKEN = "t0ken-of-at-least-16-characters"


def small(observation: dict) -> dict:
    """The last frames, at a fifth of the camera's resolution: what the runner needs, less to send."""
    return observation | {
        "frame_ns": observation["frame_ns"][-3:],
        "frames": observation["frames"][-3:, ::5, ::5],
    }


def assert_same_chunk(served, chunk) -> None:
    for name in CHUNK_FIELDS:
        ours, theirs = getattr(served, name), getattr(chunk, name)
        assert np.asarray(ours).dtype == np.asarray(theirs).dtype, name
        assert np.array_equal(ours, theirs), name


def test_a_served_chunk_equals_the_runners_in_process_and_the_metadata_names_the_policy(
    runner, observation, pipeline
) -> None:
    start = int(observation["frame_ns"][0])
    options = dict(now_ns=int(observation["frame_ns"][-1]) + 40_000_000, seed=7, episode_start_ns=start)
    expected = runner.act(Observation.checked(**observation), **options)
    with serving(runner, pipeline.policy) as running, PolicyClient(running.url) as client:
        served = client.act(observation, **options)
        assert_same_chunk(served, expected)
        assert served.past.any() and served.infer_ms > 0  # now_ns was 40 ms after the frame
        assert_same_chunk(client.act(Observation.checked(**observation), **options), expected)

        manifest = json.loads((pipeline.policy / MANIFEST).read_text())
        spec = RuntimeSpec.read(pipeline.policy)
        for metadata in (client.metadata, client.request_metadata()):
            assert metadata["policy"]["weights_sha256"] == manifest["files"]["model.safetensors"]
            assert metadata["policy"]["lineage"] == manifest["lineage"]
            runtime = metadata["runtime"]
            assert runtime["frequency_hz"] == spec.frequency_hz
            assert (runtime["n_obs_steps"], runtime["horizon"], runtime["n_action_steps"]) == (
                spec.n_obs_steps, spec.horizon, spec.n_action_steps,
            )  # fmt: skip
            assert metadata["request"]["max_bytes"] == MAX_REQUEST_BYTES


def test_four_clients_of_fifty_requests_each_are_all_answered_as_in_process(
    runner, observation, pipeline
) -> None:
    observation = small(observation)
    expected = {seed: runner.act(Observation.checked(**observation), seed=seed) for seed in range(5)}

    def robot(k: int) -> int:
        with PolicyClient(running.url) as client:
            for i in range(50):
                assert_same_chunk(client.act(observation, seed=(k + i) % 5), expected[(k + i) % 5])
        return 50

    with serving(runner, pipeline.policy) as running:
        with ThreadPoolExecutor(4) as pool:
            assert sum(pool.map(robot, range(4))) == 200
        assert running.server.counts == {"served": 200, "errors": 0, "pending": 0}


def openpi_unpackb(data: bytes):
    """A decoder written from openpi_client.msgpack_numpy's documented layout, not ours."""

    def hook(obj):
        if b"__ndarray__" in obj:
            return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
        return obj

    return msgpack.unpackb(data, object_hook=hook)


def test_an_openpi_style_client_connects_acts_and_can_slice_the_chunk_step_by_step(
    runner, observation, pipeline
) -> None:
    """What openpi's WebsocketClientPolicy does: connect (api_key in the header), read the
    metadata the server sends first, send the observation map, read the reply map; and what its
    ActionChunkBroker does with it: index every array by step."""
    observation = small(observation)
    expected = runner.act(Observation.checked(**observation), seed=4)
    with serving(runner, pipeline.policy, token=TOKEN) as running:
        headers = {"Authorization": f"Api-Key {TOKEN}"}
        with connect(running.url, compression=None, max_size=None, additional_headers=headers) as ws:
            assert openpi_unpackb(ws.recv())["policy"]["weights_sha256"]
            ws.send(openpi_packb({**observation, "seed": np.int64(4)}))
            reply = ws.recv()
            assert not isinstance(reply, str)
            action = openpi_unpackb(reply)
            assert action["server_timing"]["infer_ms"] > 0
            for name in CHUNK_FIELDS:
                assert np.array_equal(action[name], getattr(expected, name)), name
            horizon = runner.spec.horizon
            arrays = [v for v in action.values() if isinstance(v, np.ndarray)]
            assert len(arrays) == len(CHUNK_FIELDS) - 1 and all(len(a) == horizon for a in arrays)
            ws.send("not msgpack")
            assert "not_msgpack" in ws.recv()  # a text frame: openpi's client raises with it


def hostile_messages(good: bytes) -> list[bytes | str]:
    """A hundred messages a robot's bug or an attacker could send, none of them a request."""
    obs = unpack_plain(good)
    array = obs["frames"]

    def changed(**fields) -> bytes:
        return msgpack.packb({**obs, **fields})

    def array_with(**parts) -> dict:
        return {**array, **{k.encode(): v for k, v in parts.items()}}

    messages: list[bytes | str] = [
        b"",
        b"\xc1",  # never used in msgpack
        b"\x91" * 100_000,  # nested deeper than the decoder goes
        good + b"\x00",  # a second value after the request
        "a text frame",
        json.dumps({"frames": []}),
        b"GET / HTTP/1.1\r\n\r\n",
        msgpack.packb(None),
        msgpack.packb(42),
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: 2}),  # a map key that is not a string
        msgpack.packb({"__ctrl__": "shutdown"}),
        msgpack.packb({"__ctrl__": ["metadata"]}),
        msgpack.packb(msgpack.ExtType(5, b"xyz")),
        changed(frames="a picture"),
        changed(frames=[[1, 2, 3]]),
        changed(frames=msgpack.ExtType(1, b"")),
        changed(position=[[0.0, 0.0, 0.0]]),
        changed(seed=1.5),
        changed(seed=True),
        changed(seed=-3),
        changed(seed="7"),
        changed(now_ns=2**64 - 1),
        changed(episode_start_ns=[1]),
        changed(quaternions=obs["quaternion"]),
        msgpack.packb({k: v for k, v in obs.items() if k != "width"}),
        changed(frames=array_with(dtype="|O")),
        changed(frames=array_with(dtype="<U4")),
        changed(frames=array_with(dtype="i4,i4")),
        changed(frames=array_with(dtype="<c16")),
        changed(frames=array_with(dtype="x" * 1000)),
        changed(frames=array_with(dtype=None)),
        changed(frames=array_with(shape=[-1])),
        changed(frames=array_with(shape=[1, 2, 3, 4, 5, 6, 7, 8, 9])),
        changed(frames=array_with(shape="3,4")),
        changed(frames=array_with(shape=[2**31, 2**31, 0])),
        changed(frames=array_with(data="not bytes")),
        changed(frames=array_with(data=array[b"data"][:-1])),
        changed(frames={b"__ndarray__": True}),
        changed(frames={b"__npgeneric__": True, b"data": 999, b"dtype": "|u1"}),
        # Arrays that decode but are not an observation: the runner's own checks answer.
        changed(frames=msgpack_array(np.zeros((3, 48, 64, 3), np.float32))),
        changed(frames=msgpack_array(np.zeros((3, 3, 48, 64), np.uint8))),
        changed(frames=msgpack_array(np.zeros((3, 4, 4, 3), np.uint8))),
        changed(frame_ns=msgpack_array(np.array([3.0, 2.0, 1.0]))),
        changed(pose_ns=msgpack_array(np.zeros(0, np.int64))),
        changed(position=msgpack_array(np.full((len(decoded(obs["pose_ns"])), 3), np.nan))),
        changed(quaternion=msgpack_array(np.ones((len(decoded(obs["pose_ns"])), 4)))),
        changed(width=msgpack_array(np.zeros(1))),
    ]
    # Every cut of the good request: truncated in transit.
    cuts = np.linspace(1, len(good) - 1, 100 - len(messages) - 2, dtype=int)
    messages += [good[:cut] for cut in cuts]
    # Over the limit: one just over, one with a big frame stack.
    messages.append(good + b"\0" * (MAX_REQUEST_BYTES - len(good) + 1))
    messages.append(changed(frames=msgpack_array(np.zeros((25, 240, 320, 3), np.uint8))))
    assert len(messages) == 100
    return messages


def msgpack_array(a: np.ndarray) -> dict:
    return {b"__ndarray__": True, b"data": a.tobytes(), b"dtype": a.dtype.str, b"shape": list(a.shape)}


def unpack_plain(data: bytes) -> dict:
    """A request's map with its arrays left encoded."""
    return msgpack.unpackb(data, raw=False)


def decoded(encoded: dict) -> np.ndarray:
    return np.frombuffer(encoded[b"data"], encoded[b"dtype"]).reshape(encoded[b"shape"])


def test_a_hundred_hostile_messages_get_error_replies_and_the_next_good_request_is_answered(
    runner, observation, pipeline
) -> None:
    observation = small(observation)
    expected = runner.act(Observation.checked(**observation), seed=1)
    good = pack(act_message(observation, seed=1))
    codes = []
    with serving(runner, pipeline.policy) as running:
        with connect(running.url, max_size=None) as ws:
            ws.recv()  # the metadata
            for message in hostile_messages(good):
                ws.send(message)
                reply = ws.recv(timeout=10)
                assert isinstance(reply, str), "an error reply is a text frame"
                error = json.loads(reply)
                assert "Traceback" not in error["message"] and 'File "' not in error["message"]
                codes.append(error["error"])
        with PolicyClient(running.url) as client:
            assert_same_chunk(client.act(observation, seed=1), expected)
    # Each one understood as what it is: none reached the server's catch-all.
    assert set(codes) == {"not_msgpack", "bad_request", "observation", "too_large"}
    assert codes.count("too_large") == 2


def test_a_message_beyond_the_transport_limit_closes_only_its_connection(
    runner, observation, pipeline
) -> None:
    with serving(runner, pipeline.policy, max_request_bytes=2**20) as running:
        with connect(running.url, max_size=None) as ws:
            ws.recv()
            ws.send(b"\0" * (2**21 + 1))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1009  # message too big
        with PolicyClient(running.url) as client:
            assert client.health()["status"] == "ok"


def test_an_observation_the_runner_refuses_is_an_observation_error_on_the_robot_side(
    runner, observation, pipeline
) -> None:
    late_width = observation | {"width_ns": observation["width_ns"][:-1], "width": observation["width"][:-1]}
    with serving(runner, pipeline.policy) as running, PolicyClient(running.url) as client:
        with pytest.raises(ObservationError, match="never extrapolated") as caught:
            client.act(small(late_width))
        assert isinstance(caught.value, RemoteObservationError) and caught.value.code == "observation"
        assert client.act(small(observation), seed=0).execute.sum() == runner.spec.n_action_steps


def test_with_a_token_only_clients_that_send_it_connect(runner, observation, pipeline) -> None:
    with serving(runner, pipeline.policy, token=TOKEN) as running:
        for headers in (None, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": TOKEN}):
            with pytest.raises(InvalidStatus) as refused:
                connect(running.url, additional_headers=headers).close()
            assert refused.value.response.status_code == 401
        with pytest.raises(PolicyServerError, match="unauthorized"):
            PolicyClient(running.url, token="x" + TOKEN)
        with PolicyClient(running.url, token=TOKEN) as client:
            assert client.health()["status"] == "ok"
        # openpi's client sends its api_key this way.
        with connect(running.url, additional_headers={"Authorization": f"Api-Key {TOKEN}"}) as ws:
            assert msgpack.unpackb(ws.recv())["server"] == "policypipe"
        # The HTTP health check needs no token (it says no more than that the server is up).
        with urllib.request.urlopen(
            running.url.replace("ws://", "http://") + "/healthz", timeout=5
        ) as response:
            assert response.status == 200


def test_a_browser_page_cannot_connect(runner, pipeline) -> None:
    with serving(runner, pipeline.policy) as running:
        with pytest.raises(InvalidStatus) as refused:
            connect(running.url, origin="http://example.com").close()
        assert refused.value.response.status_code == 403


def test_no_token_on_a_non_loopback_bind_is_refused_before_binding(runner, pipeline) -> None:
    server = PolicyServer(runner, {"server": "policypipe"})
    for host in ("0.0.0.0", "::", "192.168.1.20", "robot-server.local", ""):
        with pytest.raises(AccessError, match="needs a token"), ServerThread(server, host=host):
            pass


class HeldRunner:
    """The real runner, each act held until the test releases it: an act as slow as the test needs."""

    def __init__(self, runner) -> None:
        self.runner, self.spec = runner, runner.spec
        self.started, self.release = threading.Event(), threading.Event()

    def act(self, *args, **kwargs):
        self.started.set()
        assert self.release.wait(10), "the test never released the act"
        return self.runner.act(*args, **kwargs)


def test_metadata_and_health_are_answered_while_an_act_is_held_in_flight(
    runner, observation, pipeline
) -> None:
    held = HeldRunner(runner)
    observation = small(observation)
    with serving(held, pipeline.policy) as running, ThreadPoolExecutor(1) as pool:
        with PolicyClient(running.url) as robot, PolicyClient(running.url, timeout_s=2) as monitor:
            chunk = pool.submit(robot.act, observation, seed=2)
            assert held.started.wait(5)
            assert monitor.request_metadata()["policy"] == robot.metadata["policy"]
            health = monitor.health()
            assert health["busy"] and health["pending"] == 1
            with PolicyClient(running.url, timeout_s=2) as late:  # a handshake too
                assert late.metadata["server"] == "policypipe"
            assert not chunk.done()
            held.release.set()
            assert_same_chunk(
                chunk.result(timeout=10), runner.act(Observation.checked(**observation), seed=2)
            )


def test_stopping_lets_the_act_in_flight_reply_then_closes_every_connection_going_away(
    runner, observation, pipeline
) -> None:
    held = HeldRunner(runner)
    observation = small(observation)
    running = serving(held, pipeline.policy)
    with running as server, ThreadPoolExecutor(2) as pool:
        robot, idle = PolicyClient(server.url), PolicyClient(server.url)
        try:
            chunk = pool.submit(robot.act, observation, seed=3)
            assert held.started.wait(5)
            stopped = pool.submit(server.stop)
            held.release.set()
            assert chunk.result(timeout=10).execute.any()  # answered, though the server was stopping
            stopped.result(timeout=15)
            for client in (robot, idle):
                with pytest.raises(PolicyServerError, match="1001"):
                    client.health()
        finally:
            robot.close()
            idle.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url.replace("ws://", "http://") + "/healthz", timeout=2)


def amplifying(observation: dict, item: bytes, budget: int) -> bytes:
    """A request of `budget` bytes whose frames are a msgpack list of one-byte `item`s: an empty map
    (0x80) or nil (0xc0) each, which a decoder without bounds builds as millions of objects."""
    fields = {k: msgpack_array(v) for k, v in small(observation).items() if k != "frames"}
    prefix = msgpack.packb({**fields, "frames": None})
    assert prefix.endswith(b"\xc0")  # frames, packed last
    count = budget - len(prefix) - 4
    return prefix[:-1] + b"\xdd" + count.to_bytes(4, "big") + item * count


@pytest.mark.parametrize("item", [b"\x80", b"\xc0"], ids=["empty_maps", "nils"])
def test_a_request_of_millions_of_tiny_values_costs_a_bounded_memory_and_never_stalls_health(
    runner, observation, pipeline, item
) -> None:
    request = amplifying(observation, item, MAX_REQUEST_BYTES - 1024)
    latencies: list[float] = []
    with serving(runner, pipeline.policy) as running, ThreadPoolExecutor(1) as pool:
        with (
            connect(running.url, max_size=None) as attacker,
            PolicyClient(running.url, timeout_s=30) as monitor,
        ):
            attacker.recv()  # the metadata
            tracemalloc.start()
            try:
                baseline = tracemalloc.get_traced_memory()[0]
                attacker.send(request)
                reply = pool.submit(attacker.recv, timeout=60)
                while not latencies or not reply.done():  # health, again and again, while it decodes
                    started = time.perf_counter()
                    assert monitor.health()["status"] == "ok"
                    latencies.append(time.perf_counter() - started)
                    time.sleep(0.05)
                peak = tracemalloc.get_traced_memory()[1] - baseline
            finally:
                tracemalloc.stop()
            error = json.loads(reply.result())
            assert error["error"] in ("bad_request", "too_large") and "frames" in error["message"]
    assert max(latencies) < 1.0
    # Both ends of the connection are in this process: the client's copies of the message and the
    # server's (websockets' buffers) are all of it, 2 to 3 times its size; unbounded, the decoding
    # took 17 (nils) to 78 (empty maps) times.
    assert peak < 6 * len(request)


def times_shifted(observation: dict, offset: int) -> dict:
    return {k: v + offset if k.endswith("_ns") else v for k, v in observation.items()}


def test_times_whose_chunk_would_wrap_around_int64_are_an_observation_error(
    runner, observation, pipeline
) -> None:
    observation = small(observation)
    latest = max(int(v.max()) for k, v in observation.items() if k.endswith("_ns"))
    near_the_end = times_shifted(observation, 2**63 - 1 - 10**6 - latest)  # 1 ms before INT64_MAX
    # Pose times going backwards by more than 2^63: their int64 difference wraps to a positive one.
    pose_ns = observation["pose_ns"].copy()
    pose_ns[-1] = int(pose_ns[-2]) - 2**63 - 10**9
    backwards = observation | {"pose_ns": pose_ns}
    with serving(runner, pipeline.policy) as running, PolicyClient(running.url) as client:
        for bad, field in ((near_the_end, "frame_ns"), (backwards, "pose_ns")):
            with pytest.raises(RemoteObservationError, match=f"{field} holds .* outside the"):
                client.act(bad, seed=0)
        assert client.act(observation, seed=0).execute.any()
        assert running.server.counts["errors"] == 2


def test_a_list_nested_a_thousand_deep_gets_bad_request_not_internal(runner, observation, pipeline) -> None:
    fields = {k: msgpack_array(v) for k, v in small(observation).items() if k != "frames"}
    request = msgpack.packb({**fields, "frames": None})[:-1] + b"\x91" * 1000 + b"\x01"
    with serving(runner, pipeline.policy) as running, connect(running.url) as ws:
        ws.recv()
        ws.send(request)
        assert json.loads(ws.recv(timeout=10))["error"] == "bad_request"


def test_stopping_drops_a_connection_that_never_finished_its_handshake_and_says_no_request_was_in_flight(
    runner, pipeline, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="policypipe.serving")
    running = serving(runner, pipeline.policy)
    with running as server, socket.create_connection(("127.0.0.1", server.port)) as silent:
        with PolicyClient(server.url) as client:
            assert client.health()["status"] == "ok"
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 3  # not the 10 s grace, nor the handshake's open timeout
        try:
            assert silent.recv(1) == b"", "closed by the server"
        except ConnectionResetError:
            pass  # closed by the server, abruptly
    assert "still in flight" not in caplog.text
    assert "connections that never finished their opening handshake, dropped: 1" in caplog.text
