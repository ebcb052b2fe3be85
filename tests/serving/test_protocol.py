"""The wire format: openpi's array layout both ways, and a decoder that refuses what it cannot trust."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from policypipe.runtime.chunk import ActionChunk
from policypipe.runtime.observation import Observation
from policypipe.serving.protocol import (
    BAD_REQUEST,
    NOT_MSGPACK,
    OBSERVATION,
    ActRequest,
    Control,
    RequestError,
    ServedChunk,
    act_message,
    decode_request,
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


def test_a_grippers_held_object_report_travels_to_the_runner() -> None:
    fields = observation_fields() | {"holding": np.array([False, True])}
    request = parse_request(unpack(pack(act_message(fields))))
    observation = Observation.checked(**request.observation)
    assert observation.grippers[0].holding_at(2) is True


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


def frames_as(value: bytes) -> bytes:
    """A request whose frames field is the msgpack `value`, raw, and every other field good."""
    fields = {k: v for k, v in act_message(observation_fields()).items() if k != "frames"}
    prefix = pack({**fields, "frames": None})
    assert prefix.endswith(b"\xc0")  # frames, packed last, as nil
    return prefix[:-1] + value


def nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\xdd" + (2**20).to_bytes(4, "big") + b"\x80" * 2**20, "list of 1048576 items"),  # empty maps
        (b"\xdd" + (2**20).to_bytes(4, "big") + b"\xc0" * 2**20, "list of 1048576 items"),  # nils
        (b"\xdf" + (2**16).to_bytes(4, "big") + b"\xa0\xc0" * 2**16, "map of 65536 items"),
        (b"\x98" + b"\x98" * 8 + b"\x80" * 64, "nested 4 deep"),  # 8 lists of 8 empty maps
        (nested(1000), "nested 4 deep"),
        (pack(msgpack.ExtType(1, b"x")), "extension type"),
        (pack("x" * 1000), "string of 1000 bytes"),
    ],
    ids=["empty_maps", "nils", "big_map", "lists_of_maps", "nested_1000", "ext", "long_string"],
)
def test_a_message_shaped_unlike_any_request_is_refused_from_its_headers_naming_the_field(
    value: bytes, says: str
) -> None:
    with pytest.raises(RequestError, match=says) as caught:
        decode_request(frames_as(value))
    assert caught.value.code == BAD_REQUEST
    assert "'frames'" in str(caught.value)


def test_more_values_than_any_request_holds_are_refused_and_a_request_of_many_cameras_is_not() -> None:
    message = msgpack.packb({f"f{i}": {f"k{j}": 0 for j in range(20)} for i in range(255)})
    with pytest.raises(RequestError, match="more than 4096 values") as caught:
        decode_request(message)
    assert caught.value.code == BAD_REQUEST
    # The bounds leave room: 8 cameras and 8 grippers, every option, and openpi's encoder.
    fields = observation_fields()
    others = {f"camera{k}_{f}": fields[f] for k in range(1, 8) for f in ("frame_ns", "frames")} | {
        f"robot{i}_{f}": fields[f]
        for i in range(1, 8)
        for f in ("pose_ns", "position", "quaternion", "width_ns", "width")
    }
    request = decode_request(pack(act_message(fields | others, now_ns=3, seed=4, episode_start_ns=1)))
    assert len(request.observation) == 8 * 7 and (request.now_ns, request.seed) == (3, 4)
    assert decode_request(openpi_packb(fields | {"seed": np.int64(4)})).seed == 4
    assert decode_request(openpi_packb({"__ctrl__": "health"})) == Control("health")


def test_a_list_nested_a_thousand_deep_is_a_bad_request_not_a_recursion_error() -> None:
    """Read without the structure check (as msgpack alone decodes it), the field's description in the
    error message is cut short, not recursed into."""
    with pytest.raises(RequestError, match=r"frames must be an encoded array .*got list \[\[\[") as caught:
        parse_request(unpack(frames_as(nested(1000))))
    assert caught.value.code == BAD_REQUEST


INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def with_times(name: str, times: np.ndarray) -> dict:
    """The fields with `name` (a time field) set to `times`, and the samples beside it as many."""
    fields = observation_fields()
    partner = {"frame_ns": "frames", "pose_ns": "position", "width_ns": "width"}[name]
    fields[partner] = np.repeat(fields[partner][:1], len(times), axis=0)
    if name == "pose_ns":
        fields["quaternion"] = np.repeat(fields["quaternion"][:1], len(times), axis=0)
    return fields | {name: times}


@pytest.mark.parametrize(
    ("name", "times", "says"),
    [
        # The latest frame near the int64 maximum: the chunk's step times would wrap to negative ones.
        ("frame_ns", np.array([INT64_MAX - 2 * 10**9, INT64_MAX - 10**9]), "outside the"),
        # uint64 beyond int64: would be read as -2 and -1.
        ("frame_ns", np.array([2**64 - 2, 2**64 - 1], np.uint64), "does not fit int64"),
        # Backwards by more than 2^63: their int64 difference wraps to a positive one.
        ("width_ns", np.array([INT64_MAX - 5, INT64_MIN + 5]), "outside the"),
        ("pose_ns", np.array([INT64_MAX - 5, INT64_MIN + 5]), "outside the"),
        # Increasing, but their difference wraps to a negative one.
        ("frame_ns", np.array([INT64_MIN, INT64_MAX]), "outside the"),
    ],
    ids=["near_int64_max", "uint64", "width_backwards", "pose_backwards", "min_to_max"],
)
def test_times_that_int64_arithmetic_would_wrap_are_refused_in_words(name, times, says) -> None:
    with pytest.raises(RequestError, match=says) as caught:
        parse_request(unpack(pack(act_message(with_times(name, times)))))
    assert caught.value.code == OBSERVATION and name in str(caught.value)
    assert "must increase" not in str(caught.value)


def test_times_within_the_range_pass_and_now_ns_beyond_it_is_refused() -> None:
    limit = 2**62
    for times in (np.array([-limit, limit]), np.array([0, 1], np.uint64), np.array([limit - 1, limit])):
        request = parse_request(unpack(pack(act_message(with_times("frame_ns", times)))))
        assert np.array_equal(request.observation["frame_ns"], times)
    for option in ("now_ns", "episode_start_ns"):
        with pytest.raises(RequestError, match=f"{option} must be within") as caught:
            parse_request(unpack(pack(act_message(observation_fields()) | {option: limit + 1})))
        assert caught.value.code == BAD_REQUEST


@pytest.mark.parametrize(
    ("name", "dtype", "says"),
    [
        ("frame_ns", np.int32, "frame_ns must be int64 nanoseconds, got int32"),
        ("pose_ns", np.uint8, "pose_ns must be int64 nanoseconds, got uint8"),
        ("position", np.int8, "position must be float32 or float64, got int8"),
        ("quaternion", np.float16, "quaternion must be float32 or float64, got float16"),
        ("width", np.bool_, "width must be float32 or float64, got bool"),
    ],
)
def test_an_array_the_runner_would_widen_up_to_eightfold_is_refused(name, dtype, says) -> None:
    fields = observation_fields()
    with pytest.raises(RequestError, match=says) as caught:
        parse_request(unpack(pack(act_message(fields | {name: fields[name].astype(dtype)}))))
    assert caught.value.code == OBSERVATION
    float32 = fields | {"position": fields["position"].astype(np.float32)}  # widened twofold: taken
    assert parse_request(unpack(pack(act_message(float32)))).observation["position"].dtype == np.float32
