"""The wire format: openpi's array layout both ways, and a decoder that refuses what it cannot trust."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from policypipe.runtime.chunk import ActionChunk
from policypipe.serving.protocol import (
    BAD_REQUEST,
    NOT_MSGPACK,
    ActRequest,
    Control,
    RequestError,
    ServedChunk,
    act_message,
    pack,
    parse_error,
    parse_request,
    unpack,
)


def openpi_packb(value) -> bytes:
    """An encoder written from openpi_client.msgpack_numpy's documented layout, not ours."""

    def default(obj):
        if isinstance(obj, np.ndarray):
            return {
                b"__ndarray__": True,
                b"data": obj.tobytes(),
                b"dtype": obj.dtype.str,
                b"shape": obj.shape,
            }
        if isinstance(obj, np.generic):
            return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
        return obj

    return msgpack.packb(value, default=default)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array([True, False]),
        np.zeros((2, 0, 3), np.uint8),
        np.array(7, np.int16),
        np.arange(6, dtype=np.int64)[::2],  # not contiguous
        np.arange(3, dtype=">f8"),  # big-endian: decoded to native, same values
    ],
)
def test_arrays_round_trip_and_openpi_encodes_them_the_same_way(array: np.ndarray) -> None:
    for data in (pack({"a": array}), openpi_packb({"a": array})):
        decoded = unpack(data)["a"]
        assert decoded.shape == array.shape and decoded.dtype == array.dtype.newbyteorder("=")
        np.testing.assert_array_equal(decoded, array)
    assert pack({"a": array}) == openpi_packb({"a": array})


def test_numpy_scalars_round_trip() -> None:
    decoded = unpack(pack({"seed": np.int64(5), "x": np.float32(0.5)}))
    assert decoded == {"seed": 5, "x": 0.5} and decoded["seed"].dtype == np.int64


@pytest.mark.parametrize(
    ("encoded", "says"),
    [
        (
            {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]},
            "not a bool, integer or float",
        ),
        ({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "i4,i4", b"shape": [1]}, "not a bool, integer"),
        ({b"__ndarray__": True, b"data": b"\0" * 7, b"dtype": "<f8", b"shape": [1]}, "needs 8 bytes"),
        ({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f8", b"shape": [-1]}, "sizes from 0"),
        (
            {b"__ndarray__": True, b"data": b"", b"dtype": "<f8", b"shape": [2**30, 2**30, 2**30, 0]},
            "too large to index",
        ),
        ({b"__ndarray__": True, b"data": "text", b"dtype": "<f8", b"shape": [1]}, "must be bytes"),
        ({b"__ndarray__": True, b"dtype": "<f8", b"shape": [1]}, "lacks its 'data'"),
        ({b"__ndarray__": True, b"data": b"", b"dtype": 5, b"shape": [0]}, "dtype string"),
        ({b"__ndarray__": True, b"data": b"", b"dtype": "nonsense", b"shape": [0]}, "unknown dtype"),
        ({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}, "does not fit|needs"),
    ],
)
def test_an_array_that_cannot_be_trusted_is_refused_saying_why(encoded: dict, says: str) -> None:
    with pytest.raises(RequestError, match=says) as caught:
        unpack(msgpack.packb({"frames": encoded}))
    assert caught.value.code == BAD_REQUEST


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x91" * 100_000, b"\x01\x02", b"\x82\x01\x02", b"\xda\xff\xff", b"\xa2\xff\xfe"],
)
def test_bytes_that_are_not_one_msgpack_value_are_refused(data: bytes) -> None:
    with pytest.raises(RequestError) as caught:
        unpack(data)
    assert caught.value.code == NOT_MSGPACK


def observation_fields() -> dict:
    return {
        "frame_ns": np.array([1, 2]),
        "frames": np.zeros((2, 8, 8, 3), np.uint8),
        "pose_ns": np.array([1, 2]),
        "position": np.zeros((2, 3)),
        "quaternion": np.tile([0.0, 0, 0, 1], (2, 1)),
        "width_ns": np.array([1, 2]),
        "width": np.zeros(2),
    }


def test_a_request_is_the_observation_fields_and_the_options_of_act() -> None:
    request = parse_request(unpack(pack(act_message(observation_fields(), now_ns=3, seed=np.int64(4)))))
    assert isinstance(request, ActRequest) and (request.now_ns, request.seed) == (3, 4)
    assert request.episode_start_ns is None and set(request.observation) == set(observation_fields())
    assert parse_request({"__ctrl__": "metadata"}) == Control("metadata")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: m | {"quaternions": m["quaternion"]}, "unknown 'quaternions'"),
        (lambda m: {k: v for k, v in m.items() if k != "width"}, "missing width"),
        (lambda m: m | {"frames": "a picture"}, "frames must be an encoded array"),
        (lambda m: m | {"position": [[0, 0, 0], [0, 0, 0]]}, "position must be an encoded array"),
        (lambda m: m | {"seed": 1.5}, "seed must be an integer"),
        (lambda m: m | {"seed": True}, "seed must be an integer"),
        (lambda m: m | {"seed": -1}, "seed must be within"),
        (lambda m: m | {"now_ns": 2**63}, "now_ns must be within"),
        (lambda m: {"__ctrl__": "reboot"}, "unknown __ctrl__"),
        (lambda m: [m], "a request is a msgpack map"),
    ],
)
def test_a_request_with_wrong_fields_or_types_is_refused_naming_them(change, says: str) -> None:
    with pytest.raises(RequestError, match=says):
        parse_request(unpack(pack(change(act_message(observation_fields())))))


def test_the_served_chunk_carries_every_field_of_the_runners_chunk() -> None:
    assert [f.name for f in dataclasses.fields(ServedChunk)] == [
        *(f.name for f in dataclasses.fields(ActionChunk)),
        "infer_ms",
    ]


def test_an_error_reply_from_another_server_is_read_as_its_message() -> None:
    assert parse_error('{"error": "observation", "message": "m"}') == ("observation", "m")
    assert parse_error("Traceback (most recent call last): ...")[1].startswith("Traceback")
