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

A request's memory is bounded by its bytes, whatever its structure. msgpack spends one byte on an
empty map (0x80) or a nil, which Python builds as an object of 16 to 64 bytes plus a list's
pointer: a 64 MiB list of them is gigabytes and seconds of work. So before msgpack builds anything,
`check_structure` walks the message's headers (skipping the bytes of strings and binaries) and
refuses any shape a request never has: nesting deeper than a request map, an encoded array's map and
its shape list; a list longer than a shape; more values than a request of many cameras holds;
extension types. What is left decodes to at most a few thousand small objects, and binaries that
copy the message's bytes once.

Times are int64 nanoseconds, and the runner adds a chunk's horizon to the latest frame and subtracts
times from each other: a request's times must lie within +-2^62 ns (146 years) of the clock's zero,
so that none of that arithmetic wraps around.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from policypipe.monitor.reading import MonitorReading
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
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
# The times a request may carry (observation times, now_ns, episode_start_ns): any two differ by
# less than 2^63, and a chunk's horizon (seconds) added to any of them stays below INT64_MAX.
TIME_LIMIT_NS = 2**62

# Fields the runner widens to float64 (camera frames stay uint8, times int64): sent as float32 or
# float64 (_check_width), by their name's end (robot{i}_position, ...).
FLOAT_FIELDS = ("position", "quaternion", "width")

# What a request can hold (check_structure). A request is a map of fields (depth 1), each an encoded
# array or scalar, a map of 3 or 4 entries (depth 2), whose shape is a list (depth 3).
MAX_DEPTH = 3
MAX_MAP_ENTRIES = 256  # a request's fields: 2 per camera, 5 per gripper, 3 options
MAX_LIST_ITEMS = MAX_NDIM  # the only list in a request is an array's shape
MAX_STRING_BYTES = 256  # field names, dtypes, control names: all short
# Keys and values in the whole message: a request of 8 cameras and 8 grippers has under 1,000.
MAX_VALUES = 4096


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
    """One msgpack value, arrays decoded, or RequestError: a reply or the metadata, from the server
    a client chose. A request is read with `unpack_request`."""
    return _unpack(data)


def unpack_request(data: bytes) -> Any:
    """A request's msgpack value, arrays decoded, or RequestError; a message shaped unlike any
    request (check_structure) is refused before anything is built."""
    check_structure(data)
    # msgpack's own limits as well, from the same bounds: each container, were the check wrong.
    return _unpack(
        data,
        max_map_len=MAX_MAP_ENTRIES,
        max_array_len=MAX_LIST_ITEMS,
        max_str_len=MAX_STRING_BYTES,
        max_ext_len=0,
    )


def _unpack(data: bytes, **limits: int) -> Any:
    try:
        # strict_map_key: map keys are strings or bytes; msgpack bounds every length by len(data).
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=True, **limits)
    except RequestError:
        raise
    except Exception as exc:  # msgpack's own errors, and ValueError, TypeError from a hostile message
        detail = str(exc)[:200] or type(exc).__name__
        raise RequestError(
            NOT_MSGPACK, f"the message is not one msgpack value this server reads ({detail})"
        ) from None


# msgpack's headers by first byte (besides the fix- ranges): what follows, and how many bytes say
# its length (containers: their items; strings, binaries, extensions: their bytes).
_SIZED = {
    0xC4: ("bin", 1), 0xC5: ("bin", 2), 0xC6: ("bin", 4),
    0xC7: ("ext", 1), 0xC8: ("ext", 2), 0xC9: ("ext", 4),
    0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4),
    0xDC: ("list", 2), 0xDD: ("list", 4), 0xDE: ("map", 2), 0xDF: ("map", 4),
}  # fmt: skip
# Nil, booleans, numbers: the bytes after their first.
_FIXED = {
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8,
    0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
}  # fmt: skip
CUT_SHORT = "the message ends inside a msgpack value (cut short?)"


def check_structure(data: bytes) -> None:
    """Refuses, from its msgpack headers alone, a message shaped unlike any request (the module's
    docstring): RequestError bad_request for a shape a request never has, not_msgpack for bytes that
    are no msgpack. Reads at most MAX_VALUES headers; skips the bytes of strings and binaries."""
    # The open containers, innermost last: [kind, items still to come (a map's: 2 per entry)].
    containers: list[list[Any]] = []
    position = values = 0
    field = ""  # the request map's key whose value is being read, named in the messages
    while True:
        parent = containers[-1] if containers else None
        is_field_name = (
            parent is not None and len(containers) == 1 and parent[0] == "map" and parent[1] % 2 == 0
        )
        if parent is not None:
            parent[1] -= 1
        if is_field_name:
            field = ""  # until read below
        start = position
        kind, size, position = _header(data, position)
        values += 1
        where = f"at byte {start}" + (f", field {field[:40]!r}" if field else "")
        if values > MAX_VALUES:
            raise RequestError(
                BAD_REQUEST, f"the message holds more than {MAX_VALUES} values: a request holds far fewer"
            )
        if kind in ("map", "list"):
            limit = MAX_MAP_ENTRIES if kind == "map" else MAX_LIST_ITEMS
            if size > limit:
                held = "a request's maps hold" if kind == "map" else "a request's only lists, shapes, hold"
                raise RequestError(BAD_REQUEST, f"a {kind} of {size} items ({where}): {held} at most {limit}")
            if len(containers) == MAX_DEPTH:
                raise RequestError(
                    BAD_REQUEST,
                    f"a {kind} nested {MAX_DEPTH + 1} deep ({where}): a request nests {MAX_DEPTH} deep at "
                    "most (its map, an encoded array's map, the array's shape)",
                )
            if size:
                containers.append([kind, 2 * size if kind == "map" else size])
                continue
        elif kind == "ext":
            raise RequestError(BAD_REQUEST, f"a msgpack extension type ({where}): a request has none")
        elif kind == "str" and size > MAX_STRING_BYTES:
            raise RequestError(
                BAD_REQUEST,
                f"a string of {size} bytes ({where}): a request's strings (field names, dtypes) have "
                f"at most {MAX_STRING_BYTES}",
            )
        else:  # a number, nil, boolean, or a string's or binary's bytes: skipped
            if position + size > len(data):
                raise RequestError(NOT_MSGPACK, CUT_SHORT)
            if is_field_name and kind == "str":
                field = data[position : position + size].decode(errors="replace")
            position += size
        while containers and containers[-1][1] == 0:
            containers.pop()
        if not containers:
            return  # one whole value: msgpack refuses any bytes after it


def _header(data: bytes, position: int) -> tuple[str, int, int]:
    """(kind, size, position after the header) of the msgpack value at `position`: size is a
    container's items, a string's, binary's or extension's bytes, or a number's bytes after its
    first ("scalar")."""
    if position >= len(data):
        raise RequestError(NOT_MSGPACK, CUT_SHORT)
    first = data[position]
    if first <= 0x7F or first >= 0xE0:  # fixints
        return "scalar", 0, position + 1
    if first <= 0x8F:
        return "map", first & 0x0F, position + 1
    if first <= 0x9F:
        return "list", first & 0x0F, position + 1
    if first <= 0xBF:
        return "str", first & 0x1F, position + 1
    if first in _FIXED:
        return "scalar", _FIXED[first], position + 1
    if 0xD4 <= first <= 0xD8:  # fixext 1, 2, 4, 8, 16
        return "ext", 1 + 2 ** (first - 0xD4), position + 1
    if first not in _SIZED:  # 0xc1: never used
        raise RequestError(NOT_MSGPACK, f"byte {position} ({first:#04x}) starts no msgpack value")
    kind, width = _SIZED[first]
    end = position + 1 + width
    if end > len(data):
        raise RequestError(NOT_MSGPACK, CUT_SHORT)
    size = int.from_bytes(data[position + 1 : end], "big")
    return kind, size + (1 if kind == "ext" else 0), end


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


class _Brief(reprlib.Repr):
    """repr cut short at every level: a list nested 1,000 deep, or a binary of 64 MiB, is never
    written out whole (repr would recurse past Python's limit, or copy it four times over)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 60, 60

    def repr_bytes(self, value: bytes, level: int) -> str:
        return repr(value[: self.maxstring]) + ("..." if len(value) > self.maxstring else "")


_BRIEF = _Brief()


def _what(value: Any) -> str:
    """What a value is, briefly: never a hostile message's whole content."""
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    text = _BRIEF.repr(value)
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
        _check_width(message[name], name)
        if name.endswith("_ns"):
            _check_times(message[name], name)
        observation[name] = message[name]
    return ActRequest(
        observation,
        now_ns=_integer(message.get("now_ns"), "now_ns", -TIME_LIMIT_NS, TIME_LIMIT_NS),
        seed=_integer(message.get("seed"), "seed", 0, INT64_MAX),
        episode_start_ns=_integer(
            message.get("episode_start_ns"), "episode_start_ns", -TIME_LIMIT_NS, TIME_LIMIT_NS
        ),
    )


def decode_request(data: bytes) -> ActRequest | Control:
    """A request message's bytes -> the request, or RequestError (the server's whole decoding)."""
    return parse_request(unpack_request(data))


def _check_width(array: np.ndarray, name: str) -> None:
    """The runner keeps times as int64 and poses and widths as float64: narrower integers, booleans
    or float16 would cost up to 8 times their bytes once widened, so they are refused (RequestError
    `observation`). Other dtypes are Observation.checked's to refuse, in its words."""
    kind, size = array.dtype.kind, array.dtype.itemsize
    if name.endswith("_ns") and kind in "iu" and size < 8:
        raise RequestError(OBSERVATION, f"{name} must be int64 nanoseconds, got {array.dtype}")
    if name.endswith(FLOAT_FIELDS) and (kind in "biu" or size < 4):
        raise RequestError(OBSERVATION, f"{name} must be float32 or float64, got {array.dtype}")


def _check_times(times: np.ndarray, name: str) -> None:
    """Integer times within +-TIME_LIMIT_NS (the module's docstring), or RequestError `observation`.
    Compared as Python integers: an unsigned time beyond INT64_MAX is not cast to a negative one.
    Other dtypes and shapes are Observation.checked's to refuse, in its words."""
    if times.dtype.kind not in "iu" or times.size == 0:
        return
    low, high = int(times.min()), int(times.max())
    if high > INT64_MAX:
        raise RequestError(
            OBSERVATION, f"{name} holds {high}, which does not fit int64: send int64 nanoseconds"
        )
    if low < -TIME_LIMIT_NS or high > TIME_LIMIT_NS:
        raise RequestError(
            OBSERVATION,
            f"{name} holds {low if low < -TIME_LIMIT_NS else high} ns, outside the +-2^62 ns "
            f"(+-{TIME_LIMIT_NS / 1e9 / 86400 / 365.25:.0f} years) this server takes, which keeps a "
            "chunk's step times and the differences of times within int64: send times of a clock "
            "nearer its zero (Unix time in nanoseconds is, until 2116)",
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
    try:  # a server whose policy has a monitor sends its reading; an older one does not
        monitor = MonitorReading.from_fields(message["monitor"]) if "monitor" in message else None
    except (ValueError, TypeError) as exc:
        raise RequestError(
            BAD_REQUEST, f"the server's reply has a malformed monitor reading: {exc}"
        ) from None
    return ServedChunk(
        observation_ns=message["observation_ns"],
        time_ns=message["time_ns"],
        grippers=grippers,
        execute=message["execute"],
        past=message["past"],
        relative=message["relative"],
        monitor=monitor,
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
