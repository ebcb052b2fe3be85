"""A served policy: the runtime tests' tiny pipeline (sample recordings converted, an untrained
policy saved with its runtime spec), its runner, and an observation built from a recording."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from policypipe.runtime.runner import PolicyRunner
from policypipe.serving.metadata import policy_metadata
from policypipe.serving.server import PolicyServer, ServerThread
from tests.runtime.test_runner import good_observation, pipeline  # noqa: F401 (a fixture, by name)

MAX_REQUEST_BYTES = 4 * 2**20


@pytest.fixture(scope="module")
def runner(pipeline) -> PolicyRunner:  # noqa: F811
    return PolicyRunner.load(pipeline.policy)


@pytest.fixture(scope="module")
def observation(pipeline) -> dict:  # noqa: F811
    return good_observation(pipeline)


@contextlib.contextmanager
def serving(runner, folder, token: str | None = None, max_request_bytes: int = MAX_REQUEST_BYTES):
    """The server in process, on loopback, on a port the system chooses."""
    metadata = policy_metadata(folder, runner.spec.to_json(), max_request_bytes)
    with ServerThread(PolicyServer(runner, metadata, token, max_request_bytes)) as running:
        yield running


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny policy's act takes 4 ms on one thread, and 25 to 250 ms on two when the machine's
    two cores are shared with other work (torch's threads wait for each other); in-process and
    served acts run under the same setting, so their chunks stay bit-identical."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def leaves_no_thread_behind():
    """Servers and clients stopped: no thread of theirs outlives the test."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left, f"the test left threads behind: {sorted(t.name for t in left)}"
