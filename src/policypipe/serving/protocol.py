"""The messages between a robot and `policypipe serve` (docs/serving.md, "Protocol").

Every message is one websocket frame. Requests and replies are binary frames holding one msgpack
map; an error reply is a text frame holding JSON {"error": code, "message": text}. Arrays travel
in the layout of openpi's `msgpack_numpy`, so that its clients' encoders work unchanged:

  array         {b"__ndarray__": True, b"data": bytes (C order), b"dtype": "<f8", b"shape": [3, 4]}
  NumPy scalar  {b"__npgeneric__": True, b"data": 5, b"dtype": "<i8"}

Decoding trusts nothing: only bool, integer and float dtypes of at most 8 bytes, bytes that fill
the shape exactly, the fields of a request and nothing else; whatever is wrong is a RequestError
that says what, never an exception from deeper down. NumPy and msgpack only: the robot side
imports this without torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from policypipe.runtime.chunk import TARGET_FIELDS, ActionChunk, GripperTargets, target_field
from policypipe.runtime.observation import Observation, is_field_name

PROTOCOL_VERSION = 1

CONTROL = "__ctrl__"
# episode_start and episode_end: what openpi's newer clients send around an episode; acknowledged
# ({"__ack__": name}) so that they work, and otherwise ignored.
CONTROLS = ("metadata", "health", "episode_start", "episode_end")

# Observation.checked's arguments for camera 0 and gripper 0, always sent (camera k >= 1 and
# gripper i >= 1 add theirs: camera{k}_frame_ns, robot{i}_position, ...), and PolicyRunner.act's
# keyword arguments.
OBSERVATION_FIELDS = ("frame_ns", "frames", "pose_ns", "position", "quaternion", "width_ns", "width")
OPTION_FIELDS = ("now_ns", "seed", "episode_start_ns")
# ActionChunk.fields() of a one-gripper chunk (gripper i >= 1 adds robot{i}_position, ...).
CHUNK_FIELDS = ("observation_ns", "time_ns", "position", "quaternion", "width", "execute", "past", "relative")
OTHER_TARGET = re.compile(r"^robot([1-9][0-9]*)_(position|quaternion|width)$")

# Error codes (the `error` of an error reply).
TOO_LARGE = "too_large"
NOT_MSGPACK = "not_msgpack"
BAD_REQUEST = "bad_request"
OBSERVATION = "observation"
INTERNAL = "internal"

ARRAY_KEY = b"__ndarray__"
SCALAR_KEY = b"__npgeneric__"
DTYPE_KINDS = "biuf"  # bool, signed and unsigned integers, floats: no objects, strings or records
MAX_NDIM = 8
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1


class RequestError(ValueError):
    """A message the server cannot act on; `code` says which kind, the message what to send."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Control:
    """A request for something other than actions: `metadata`, `health`, an episode's start or end."""

    name: str


@dataclass(frozen=True)
class ActRequest:
    """`runner.act(Observation.checked(**observation), now_ns=..., seed=..., episode_start_ns=...)`."""

    observation: dict[str, np.ndarray]
    now_ns: int | None = None
    seed: int | None = None
    episode_start_ns: int | None = None


@dataclass(frozen=True)
class ServedChunk(ActionChunk):
    """An ActionChunk as the client receives it, and how long the server's act took."""

    infer_ms: float = math.nan


def pack(message: Any) -> bytes:
    return msgpack.packb(message, default=_encode)


def unpack(data: bytes) -> Any:
    """One msgpack value, arrays decoded, or RequestError."""
    try:
        # strict_map_key: map keys are strings or bytes; msgpack bounds every length by len(data).
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=True)
    except RequestError:
        raise
    except Exception as exc:  # msgpack's own errors, and ValueError, TypeError from a hostile message
        detail = str(exc)[:200] or type(exc).__name__
        raise RequestError(
            NOT_MSGPACK, f"the message is not one msgpack value this server reads ({detail})"
        ) from None


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        _check_dtype(value.dtype)
        return {
            ARRAY_KEY: True,
            b"data": value.tobytes(),  # C order, whatever the strides
            b"dtype": value.dtype.str,
            b"shape": list(value.shape),
        }
    if isinstance(value, np.generic):
        _check_dtype(value.dtype)
        return {SCALAR_KEY: True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"cannot send a {type(value).__name__}: send arrays, numbers, strings, lists and maps")


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in DTYPE_KINDS or dtype.itemsize > 8:
        raise TypeError(f"cannot send dtype {dtype}: only bool, integer and float arrays of up to 8 bytes")


def _decode(obj: dict) -> Any:
    """msgpack's object_hook: every map, innermost first."""
    if ARRAY_KEY in obj or "__ndarray__" in obj:
        return _decode_array(obj)
    if SCALAR_KEY in obj or "__npgeneric__" in obj:
        return _decode_scalar(obj)
    return obj


def _part(obj: dict, name: str) -> Any:
    for key in (name.encode(), name):  # openpi's encoder writes bytes keys, others may write strings
        if key in obj:
            return obj[key]
    raise RequestError(BAD_REQUEST, f"an encoded array or scalar lacks its {name!r}")


def _dtype(name: Any) -> np.dtype:
    if not isinstance(name, str) or len(name) > 8:
        raise RequestError(
            BAD_REQUEST, f"an array's dtype must be a NumPy dtype string like '<f8', got {_what(name)}"
        )
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise RequestError(
            BAD_REQUEST, f"unknown dtype {name!r}: use NumPy's dtype.str, like '<f8' or '|u1'"
        ) from None
    if dtype.kind not in DTYPE_KINDS or dtype.itemsize > 8:
        raise RequestError(
            BAD_REQUEST, f"dtype {name!r} is not a bool, integer or float type of up to 8 bytes"
        )
    return dtype


def _decode_array(obj: dict) -> np.ndarray:
    data, dtype, shape = _part(obj, "data"), _dtype(_part(obj, "dtype")), _part(obj, "shape")
    if not isinstance(data, bytes):
        raise RequestError(BAD_REQUEST, f"an array's data must be bytes (msgpack bin), got {_what(data)}")
    if (
        not isinstance(shape, list | tuple)
        or len(shape) > MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= INT32_MAX for d in shape)
    ):
        raise RequestError(
            BAD_REQUEST,
            f"an array's shape must be a list of at most {MAX_NDIM} sizes from 0 to {INT32_MAX}, "
            f"got {_what(shape)}",
        )
    needed = math.prod(shape) * dtype.itemsize
    if needed != len(data):
        raise RequestError(
            BAD_REQUEST,
            f"an array of shape {list(shape)[:MAX_NDIM]} and dtype {dtype.str} needs {needed} bytes, "
            f"its data has {len(data)}",
        )
    try:
        array = np.frombuffer(data, dtype).reshape(shape)
    except ValueError:  # an empty array whose other sizes multiply beyond what NumPy can index
        raise RequestError(BAD_REQUEST, f"an array of shape {list(shape)} is too large to index") from None
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def _decode_scalar(obj: dict) -> np.generic:
    data, dtype = _part(obj, "data"), _dtype(_part(obj, "dtype"))
    if not isinstance(data, bool | int | float):
        raise RequestError(BAD_REQUEST, f"a NumPy scalar's data must be a number, got {_what(data)}")
    try:
        return dtype.type(data)
    except (OverflowError, ValueError, TypeError):
        raise RequestError(BAD_REQUEST, f"{data!r} does not fit dtype {dtype.str}") from None


def _what(value: Any) -> str:
    """What a value is, briefly: never a hostile message's whole content."""
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def parse_request(message: Any) -> ActRequest | Control:
    if not isinstance(message, dict):
        raise RequestError(BAD_REQUEST, f"a request is a msgpack map, got {_what(message)}")
    if CONTROL in message:
        name = message[CONTROL]
        if not isinstance(name, str) or name not in CONTROLS:
            raise RequestError(
                BAD_REQUEST, f"unknown {CONTROL} {_what(name)}: one of {', '.join(CONTROLS)}, or no {CONTROL}"
            )
        return Control(name)
    unknown = [k for k in message if not (isinstance(k, str) and is_field_name(k)) and k not in OPTION_FIELDS]
    missing = [k for k in OBSERVATION_FIELDS if k not in message]
    if unknown or missing:
        problems = ([f"unknown {', '.join(repr(k)[:40] for k in unknown[:5])}"] if unknown else []) + (
            [f"missing {', '.join(missing)}"] if missing else []
        )
        raise RequestError(
            BAD_REQUEST,
            f"an act request has the fields {', '.join(OBSERVATION_FIELDS)}, those of any further camera "
            "and gripper (camera{k}_frame_ns, camera{k}_frames, robot{i}_pose_ns, ...) "
            f"and optionally {', '.join(OPTION_FIELDS)}; this one: {'; '.join(problems)}",
        )
    observation = {}
    for name in (k for k in message if k not in OPTION_FIELDS):
        if not isinstance(message[name], np.ndarray):
            raise RequestError(
                BAD_REQUEST,
                f"{name} must be an encoded array ({ARRAY_KEY!r} map), got {_what(message[name])}",
            )
        observation[name] = message[name]
    return ActRequest(
        observation,
        now_ns=_integer(message.get("now_ns"), "now_ns", INT64_MIN, INT64_MAX),
        seed=_integer(message.get("seed"), "seed", 0, INT64_MAX),
        episode_start_ns=_integer(message.get("episode_start_ns"), "episode_start_ns", INT64_MIN, INT64_MAX),
    )


def _integer(value: Any, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise RequestError(BAD_REQUEST, f"{name} must be an integer or nil, got {_what(value)}")
    if not low <= int(value) <= high:
        raise RequestError(BAD_REQUEST, f"{name} must be within {low}..{high}, got {int(value)}")
    return int(value)


def act_message(
    observation: Any, now_ns: int | None = None, seed: int | None = None, episode_start_ns: int | None = None
) -> dict[str, Any]:
    """The request for `observation`: an Observation, or a mapping of its arrays by the names
    `Observation.checked` takes (all of them are sent: the server refuses a name it does not know)."""
    fields = observation.fields() if isinstance(observation, Observation) else observation
    if not isinstance(fields, Mapping):
        raise TypeError(f"send an Observation or a mapping of its arrays, not a {type(observation).__name__}")
    message: dict[str, Any] = {name: np.asarray(value) for name, value in fields.items()}
    options = {"now_ns": now_ns, "seed": seed, "episode_start_ns": episode_start_ns}
    message.update({k: int(v) for k, v in options.items() if v is not None})
    return message


def chunk_message(chunk: ActionChunk, infer_ms: float) -> dict[str, Any]:
    """The reply for an ActionChunk: its fields, and openpi's `server_timing`."""
    return chunk.fields() | {"server_timing": {"infer_ms": float(infer_ms)}}


def chunk_from_message(message: Any) -> ServedChunk:
    if not isinstance(message, dict) or any(name not in message for name in CHUNK_FIELDS):
        raise RequestError(BAD_REQUEST, f"the server's reply is not an action chunk: {_what(message)}")
    others = sorted(
        {int(m[1]) for name in message if isinstance(name, str) and (m := OTHER_TARGET.match(name))}
    )
    try:
        grippers = {
            i: GripperTargets(**{f: message[target_field(i, f)] for f in TARGET_FIELDS}) for i in [0, *others]
        }
    except KeyError as exc:
        raise RequestError(BAD_REQUEST, f"the server's reply lacks {exc.args[0]}") from None
    timing = message.get("server_timing") or {}
    return ServedChunk(
        observation_ns=message["observation_ns"],
        time_ns=message["time_ns"],
        grippers=grippers,
        execute=message["execute"],
        past=message["past"],
        relative=message["relative"],
        infer_ms=float(timing.get("infer_ms", math.nan)),
    )


def error_text(code: str, message: str) -> str:
    return json.dumps({"error": code, "message": message})


def parse_error(text: str) -> tuple[str, str]:
    """(code, message) of an error reply; a text frame from another server is its own message."""
    try:
        raw = json.loads(text)
        return str(raw["error"]), str(raw["message"])
    except (ValueError, KeyError, TypeError):
        return INTERNAL, text
