"""File names and byte-level checks of an export folder (see shared/recording-format.md).

For every raw recording with stem S the studio writes exactly `S.mcap`, `S_vio.mcap` and
`S_vio.json` in one folder. Anything else is not an input.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

RAW_SUFFIX = ".mcap"
VIO_SUFFIX = "_vio.mcap"
STATUS_SUFFIX = "_vio.json"

STATUS_REQUIRED_KEYS = ("source", "output", "status")
STATUS_SUCCESS = "success"
# The documented fields of `S_vio.json` and the JSON types each may hold. Only these reach the
# manifest: whatever else a status file carries is not ours to pass downstream.
STATUS_FIELDS: dict[str, tuple[type, ...]] = {
    "source": (str,),
    "output": (str,),
    "status": (str,),
    "error": (str, type(None)),
    "task": (str, type(None)),
    "frames": (int, type(None)),
    "started_at": (str, type(None)),
    "finished_at": (str, type(None)),
    "studio_version": (str, type(None)),
    # Not the studio's: `policypipe corrections` writes it (rollout/corrections.py), naming the round,
    # the policy that drove and the takeover, so that the manifest's lineage carries them.
    "correction": (dict,),
}
# A real status file is a few hundred bytes; anything past this is not one, and is not read.
MAX_STATUS_BYTES = 1_000_000

MCAP_MAGIC = b"\x89MCAP0\r\n"
_OP_HEADER = 0x01
_OP_FOOTER = 0x02
# Footer record: opcode (1) + record length (8) + summary start (8) + summary offset start (8) + CRC (4).
_FOOTER_LENGTH = 20
_FOOTER_RECORD_SIZE = 1 + 8 + _FOOTER_LENGTH
_MIN_MCAP_SIZE = 2 * len(MCAP_MAGIC) + 1 + 8 + _FOOTER_RECORD_SIZE

# Leftovers the studio is known to write next to a recording; named in the report so a
# person recognises them at once.
_RETRY = re.compile(r"^(?P<stem>.+)_vio( \(\d+\)|_retry\d+)\.mcap$")
_PARTIAL = re.compile(r"^(?P<stem>.+)_vio\.(mcap|json)\.(partial|tmp|part|bak)$")


class Role(enum.Enum):
    RAW = "raw"
    VIO = "vio"
    STATUS = "status"
    HDF5 = "hdf5"  # a robomimic / MimicGen file, the source of each of its demos (`recordings.hdf5`)


# The three files of one studio recording.
MCAP_ROLES = (Role.RAW, Role.VIO, Role.STATUS)


def classify(name: str) -> tuple[Role, str] | None:
    """The role and stem of an input file name, or None if the name is not an input."""
    if name.endswith(STATUS_SUFFIX) and len(name) > len(STATUS_SUFFIX):
        return Role.STATUS, name[: -len(STATUS_SUFFIX)]
    if name.endswith(VIO_SUFFIX) and len(name) > len(VIO_SUFFIX):
        return Role.VIO, name[: -len(VIO_SUFFIX)]
    if name.endswith(RAW_SUFFIX) and len(name) > len(RAW_SUFFIX) and not _RETRY.match(name):
        return Role.RAW, name[: -len(RAW_SUFFIX)]
    return None


def file_names(stem: str) -> dict[Role, str]:
    return {Role.RAW: stem + RAW_SUFFIX, Role.VIO: stem + VIO_SUFFIX, Role.STATUS: stem + STATUS_SUFFIX}


def describe_non_input(name: str) -> str:
    """Why a file that is not named like an input is not one, in words a person recognises."""
    if m := _RETRY.match(name):
        return f"retry leftover of recording {m['stem']!r}: not an input (only {m['stem']}{VIO_SUFFIX} is)"
    if m := _PARTIAL.match(name):
        return f"partial or temporary leftover of recording {m['stem']!r}: not an input"
    if name.startswith(".") or name.endswith("~"):
        return "hidden or backup file: not an input"
    return f"not a recording file (inputs are S{RAW_SUFFIX}, S{VIO_SUFFIX}, S{STATUS_SUFFIX})"


class McapState(enum.Enum):
    COMPLETE = "complete"
    TRUNCATED = "truncated"
    NOT_MCAP = "not_mcap"


def mcap_state(path: Path) -> tuple[McapState, str]:
    """Reads only the first and last bytes: does the file start like an MCAP and end with a footer?

    A writer that crashed, or a copy that stopped early, leaves a file with the leading magic
    but without the footer and trailing magic.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(MCAP_MAGIC) + 1)
        if head[: len(MCAP_MAGIC)] != MCAP_MAGIC:
            return McapState.NOT_MCAP, f"not an MCAP file (starts with {head[:8]!r})"
        if len(head) <= len(MCAP_MAGIC) or head[len(MCAP_MAGIC)] != _OP_HEADER:
            return McapState.TRUNCATED, "truncated: MCAP magic without a header record"
        if size < _MIN_MCAP_SIZE:
            return McapState.TRUNCATED, f"truncated: only {size} bytes, no MCAP footer"
        f.seek(size - len(MCAP_MAGIC) - _FOOTER_RECORD_SIZE)
        tail = f.read()
    footer, magic = tail[:_FOOTER_RECORD_SIZE], tail[_FOOTER_RECORD_SIZE:]
    complete = (
        magic == MCAP_MAGIC
        and footer[0] == _OP_FOOTER
        and int.from_bytes(footer[1:9], "little") == _FOOTER_LENGTH
    )
    if not complete:
        return (
            McapState.TRUNCATED,
            "truncated: no MCAP footer at the end (the copy or the writer stopped early)",
        )
    return McapState.COMPLETE, "complete"
