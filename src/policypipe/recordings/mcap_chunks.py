"""Chunk-level recovery in an MCAP file: a damaged chunk is skipped, what it held is counted as
lost as far as the file tells, and reading goes on with the next chunk. A chunk is damaged if its
fields do not fit its record, it does not decompress or parse, or its CRC (when the writer wrote
one) does not match.

- With a summary (chunk indexes): chunk by chunk through the indexes (`indexed_messages`). The
  lost messages are counted from the chunk's message index, or from the summary's statistics.
- Without one (a writer that crashed or never indexes): record by record from the start
  (`sequential_messages`). Every record is framed as opcode (uint8), content length (uint64
  little-endian), content, so a damaged chunk whose length field holds is stepped over; its lost
  messages are counted from the message index records that follow it, if the writer wrote any.
  A length that runs past the end of the file, or a chunk whose own fields do not fit it, means
  the framing itself is damaged (or the file is cut): the bytes after it are scanned for the next
  chunk that checks out (fields, decompression, CRC) or the file's DataEnd record, and reading
  goes on there. Without either, reading stops (`ReadingStopped`): the file was cut.
"""

from __future__ import annotations

import io
import logging
import re
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from mcap.data_stream import ReadDataStream
from mcap.exceptions import McapError
from mcap.opcode import Opcode
from mcap.reader import FOOTER_SIZE, SeekingReader
from mcap.records import Channel, Chunk, ChunkIndex, Footer, Message, MessageIndex, Schema
from mcap.stream_reader import MAGIC_SIZE, CRCValidationError, StreamReader, breakup_chunk, read_magic
from mcap.summary import Summary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostChunk:
    """A damaged chunk, or damaged bytes skipped up to the next sound record, and what it held."""

    where: str  # "chunk at byte 1234", "bytes 1234 to 5678", "data section"
    why: str  # what is wrong, and what its bytes still tell (extent, log times from its header)
    lost: Counter[str] | None  # its messages by topic, or None if they cannot be counted
    unknown: str = ""  # why `lost` is None


@dataclass
class ChunkLosses:
    """What damage cost: damaged chunks; messages of unindexed damaged chunks, from the summary's
    statistics; messages whose channel or schema record was lost (by topic, or "<channel N>")."""

    chunks: list[LostChunk] = field(default_factory=list)
    unindexed: Counter[str] | None = None
    unattributed: Counter[str] = field(default_factory=Counter)


class ReadingStopped(McapError):
    """Nothing readable after this point: the file was cut (or all the rest is damaged)."""


RECORD_SIZE_LIMIT = 1 << 30
_COMPRESSIONS = ("", "zstd", "lz4")
_HEAD = struct.Struct("<BQ")  # in front of every record: opcode, content length
_MAGIC = b"\x89MCAP0\r\n"
_FOOTER_AT_END = struct.Struct("<BQQQI8s")  # the footer record and the closing magic
_SCAN_BLOCK = 1 << 20
_CANDIDATE = re.compile(rb"[\x06\x0f]")  # where a resynchronisation may land: Chunk, DataEnd


# ---------------------------------------------------------------- chunk by chunk through the index


def chunk_summary(f: IO[bytes], path: Path) -> Summary | None:
    """The summary, if the file has one that indexes chunks and names channels, and whose CRC
    (when written) holds; else None, and the file is read record by record."""
    try:
        size = f.seek(0, io.SEEK_END)
        f.seek(size - FOOTER_SIZE - MAGIC_SIZE)
        footer = next(StreamReader(f, skip_magic=True, record_size_limit=RECORD_SIZE_LIMIT).records)
        if not isinstance(footer, Footer) or not 0 < footer.summary_start < size:
            return None
        if footer.summary_crc != 0:
            # The CRC covers the summary and the footer up to the CRC field itself.
            f.seek(footer.summary_start)
            if zlib.crc32(f.read(size - MAGIC_SIZE - 4 - footer.summary_start)) != footer.summary_crc:
                log.warning("%s: summary CRC mismatch: reading the file in one pass", path.name)
                return None
        f.seek(0)
        summary = SeekingReader(f, record_size_limit=RECORD_SIZE_LIMIT).get_summary()
    except Exception as exc:  # noqa: BLE001 - a cut or damaged end of file: no usable summary
        log.debug("%s: no usable summary (%s: %s)", path.name, type(exc).__name__, exc)
        return None
    # Without channels in the summary, a message's channel is only known from records that
    # may sit in a damaged chunk: record by record it is.
    if summary is None or not summary.chunk_indexes or not summary.channels:
        return None
    return summary


def indexed_messages(
    f: IO[bytes], summary: Summary, losses: ChunkLosses
) -> Iterator[tuple[Schema | None, Channel, Message]]:
    """(schema, channel, message) in file order, chunk by chunk; damaged chunks go to `losses`."""
    schemas = dict(summary.schemas)
    channels = dict(summary.channels)
    read_by_channel: Counter[int] = Counter()
    known_lost: Counter[int] = Counter()
    unindexed = False
    for index in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
        try:
            records = _indexed_chunk_records(f, index)
        except _DamagedChunk as damaged:
            by_channel = _indexed_counts(f, index)
            if by_channel is None:
                unindexed = True
            else:
                known_lost.update(by_channel)
            # Lost on a FrameTransform pose topic counts every transform, of any child frame.
            lost = None if by_channel is None else _by_topic(channels, by_channel)
            losses.chunks.append(
                LostChunk(
                    f"chunk at byte {index.chunk_start_offset}",
                    str(damaged),
                    lost,
                    "the chunk has no message index",
                )
            )
            continue
        for record in records:
            if isinstance(record, Schema):
                schemas[record.id] = record
            elif isinstance(record, Channel):
                channels[record.id] = record
            elif isinstance(record, Message):
                channel = channels.get(record.channel_id)
                if channel is None:
                    raise McapError(f"no channel record found with id {record.channel_id}")
                if channel.schema_id != 0 and channel.schema_id not in schemas:
                    raise McapError(f"no schema record found with id {channel.schema_id}")
                read_by_channel[record.channel_id] += 1
                yield schemas.get(channel.schema_id), channel, record
    if unindexed:
        # Some damaged chunk has no message index. The summary statistics count every
        # channel's messages in the whole file: what the undamaged chunks did not hold was lost.
        stats = summary.statistics
        if stats is not None and stats.channel_message_counts:
            rest = Counter(
                {c: n - read_by_channel[c] - known_lost[c] for c, n in stats.channel_message_counts.items()}
            )
            losses.unindexed = _by_topic(channels, +rest)  # unary +: positive counts only


# ---------------------------------------------------------------- one chunk's checks (both ways)


class _DamagedChunk(Exception):
    pass


def _indexed_chunk_records(f: IO[bytes], index: ChunkIndex) -> list:
    """All records of one chunk, after checking its framing against its index: a damaged chunk
    yields nothing rather than a part of its messages."""
    f.seek(index.chunk_start_offset)
    raw = f.read(index.chunk_length)
    if len(raw) != index.chunk_length:
        raise _DamagedChunk("cut short")
    opcode, length = _HEAD.unpack_from(raw)
    if opcode != Opcode.CHUNK or length != index.chunk_length - _HEAD.size:
        raise _DamagedChunk(f"not the chunk the index describes (opcode {opcode:#x}, length {length})")
    chunk = _read_chunk(raw[_HEAD.size :])
    if len(chunk.data) != index.compressed_size or chunk.compression != index.compression:
        raise _DamagedChunk("chunk header differs from its index")
    return _chunk_records(chunk)


def _read_chunk(content: bytes) -> Chunk:
    """A Chunk record from its content, if its fields fit in it (a writer may pad a record with
    bytes after its fields, never cut one)."""
    # message_start_time, message_end_time, uncompressed_size (uint64), uncompressed_crc,
    # compression name length (uint32), the name, the records' length (uint64), the records.
    if len(content) < 32:
        raise _DamagedChunk(f"its fields do not fit in its {len(content)} bytes")
    name_length = struct.unpack_from("<I", content, 28)[0]
    if 32 + name_length + 8 > len(content):
        raise _DamagedChunk(f"its fields do not fit in its {len(content)} bytes")
    records_length = struct.unpack_from("<Q", content, 32 + name_length)[0]
    if 40 + name_length + records_length > len(content):
        raise _DamagedChunk(f"its records ({records_length} bytes) do not fit in its {len(content)} bytes")
    try:
        return Chunk.read(ReadDataStream(io.BytesIO(content)))
    except Exception as exc:  # noqa: BLE001 - a compression name that is not UTF-8
        raise _DamagedChunk(f"its header cannot be parsed ({type(exc).__name__}: {exc})") from exc


def _chunk_records(chunk: Chunk) -> list:
    """The records of a chunk, after checking its decompression and CRC (when the writer wrote one)."""
    if chunk.compression not in _COMPRESSIONS:
        raise _DamagedChunk(f"unknown compression {chunk.compression!r}")
    if chunk.uncompressed_size > RECORD_SIZE_LIMIT:
        raise _DamagedChunk(f"says it holds {chunk.uncompressed_size} bytes uncompressed")
    try:
        return breakup_chunk(chunk, validate_crc=True)
    except CRCValidationError as exc:
        raise _DamagedChunk("CRC mismatch") from exc
    except Exception as exc:  # noqa: BLE001 - bytes that do not decompress or parse
        raise _DamagedChunk(f"cannot decompress or parse ({type(exc).__name__}: {exc})") from exc


def _indexed_counts(f: IO[bytes], index: ChunkIndex) -> Counter[int] | None:
    """Messages per channel id in a chunk, from its message index records, or None if it has
    none or they are unreadable.

    The message index records follow the chunk record in the file, outside its (possibly
    garbage) compressed bytes, and list one entry per message: they count exactly what a
    damaged chunk held even when not one of its records can be parsed.
    """
    if not index.message_index_offsets:
        return None
    start = index.chunk_start_offset + index.chunk_length
    counts: Counter[int] = Counter()
    try:
        for channel_id, offset in index.message_index_offsets.items():
            if not start <= offset < start + index.message_index_length:
                return None
            f.seek(offset)
            record = next(StreamReader(f, skip_magic=True, record_size_limit=RECORD_SIZE_LIMIT).records)
            if not isinstance(record, MessageIndex) or record.channel_id != channel_id:
                return None
            counts[channel_id] = len(record.records)
    except Exception:  # noqa: BLE001 - damaged index: counts unknown
        return None
    return counts


def _by_topic(channels: dict[int, Channel], by_channel: Counter[int]) -> Counter[str]:
    """Counts per channel id -> per topic (two channels may share a topic)."""
    out: Counter[str] = Counter()
    for channel_id, n in by_channel.items():
        channel = channels.get(channel_id)
        out[channel.topic if channel is not None else f"<channel {channel_id}>"] += n
    return out


# ---------------------------------------------------------------- record by record, without a summary


def sequential_messages(
    f: IO[bytes], losses: ChunkLosses
) -> Iterator[tuple[Schema | None, Channel, Message]]:
    """(schema, channel, message) in file order, record by record from the start; damaged chunks
    and skipped bytes go to `losses`. Raises ReadingStopped where nothing after is readable."""
    walk = _Walk(f)
    try:
        yield from walk.messages()
    finally:  # also when reading stops: what was lost before is known
        for loss in walk.lost:
            lost = None if loss.by_channel is None else _by_topic(walk.channels, +loss.by_channel)
            losses.chunks.append(LostChunk(loss.where, loss.why, lost, loss.unknown))
        losses.unattributed.update(_by_topic(walk.channels, walk.unattributed))


@dataclass
class _Loss:
    where: str
    why: str
    by_channel: Counter[int] | None = None  # None: not known (yet: the message index may follow)
    unknown: str = "no message index follows it"
    index_damaged: bool = False


class _Walk:
    """One pass over the records of a file, from its magic to its DataEnd record."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.size = f.seek(0, io.SEEK_END)
        self.schemas: dict[int, Schema] = {}
        self.channels: dict[int, Channel] = {}
        self.lost: list[_Loss] = []
        self.unattributed: Counter[int] = Counter()  # channel id -> messages that cannot be decoded

    def messages(self) -> Iterator[tuple[Schema | None, Channel, Message]]:
        self.f.seek(0)
        read_magic(ReadDataStream(self.f))
        pos = MAGIC_SIZE
        damaged: _Loss | None = None  # the damaged chunk just read, while its message index follows
        while True:
            head = self.f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise ReadingStopped(
                    f"the file ends at byte {self.size}, before its DataEnd record: it was cut"
                )
            opcode, length = _HEAD.unpack(head)
            end = pos + _HEAD.size + length
            if length > RECORD_SIZE_LIMIT or end > self.size:
                why = f"its length field says {length} bytes, past the end of the file ({self.size} bytes)"
                pos, damaged = self._resync(pos, why), None
                continue
            content = self.f.read(length)
            if opcode == Opcode.DATA_END:
                self._check_data_crc(pos, content)
                return
            if opcode == Opcode.MESSAGE_INDEX:
                if damaged is not None:
                    _count_index(damaged, content)
                pos = end
                continue
            damaged = None
            if opcode == Opcode.CHUNK:
                try:
                    chunk = _read_chunk(content)
                except _DamagedChunk as why:
                    # Its fields disagree with the record's length: that length cannot be trusted.
                    pos = self._resync(pos, str(why))
                    continue
                try:
                    records = _chunk_records(chunk)
                except _DamagedChunk as why:
                    known = ", ".join(
                        [
                            f"bytes {pos} to {end}",
                            *_log_times(chunk.message_start_time, chunk.message_end_time),
                        ]
                    )
                    damaged = _Loss(f"chunk at byte {pos}", f"{why} ({known})")
                    self.lost.append(damaged)
                    records = []
                yield from self._messages(records)
            elif opcode in (Opcode.SCHEMA, Opcode.CHANNEL, Opcode.MESSAGE):  # outside chunks
                try:
                    record = _read_plain(opcode, content)
                except Exception as exc:  # noqa: BLE001 - fields that do not fit their record
                    # A message is lost; a lost channel or schema costs the messages that use it,
                    # counted as they come.
                    lost = Counter(
                        [content[0] | content[1] << 8] if opcode == Opcode.MESSAGE and length >= 2 else []
                    )
                    why = f"{_record_name(opcode)} that cannot be parsed ({exc})"
                    self.lost.append(_Loss(f"record at byte {pos}", why, lost))
                else:
                    yield from self._messages([record])
            elif opcode == Opcode.FOOTER:  # no DataEnd record, but the data section ended all the same
                return
            # Header, attachments, metadata, unknown opcodes: nothing a recording needs.
            pos = end

    def _messages(self, records: list) -> Iterator[tuple[Schema | None, Channel, Message]]:
        for record in records:
            if isinstance(record, Schema):
                self.schemas[record.id] = record
            elif isinstance(record, Channel):
                self.channels[record.id] = record
            elif isinstance(record, Message):
                channel = self.channels.get(record.channel_id)
                if channel is None or (channel.schema_id != 0 and channel.schema_id not in self.schemas):
                    # Its channel or schema record was in a damaged chunk: it cannot be decoded.
                    self.unattributed[record.channel_id] += 1
                    continue
                yield self.schemas.get(channel.schema_id), channel, record

    def _resync(self, pos: int, why: str) -> int:
        """Where reading goes on after the record at `pos`, whose length cannot be trusted."""
        self.f.seek(pos)
        head = self.f.read(_HEAD.size + 16)
        known = [why]
        if head[0] == Opcode.CHUNK and len(head) == _HEAD.size + 16:
            known += _log_times(*struct.unpack_from("<QQ", head, _HEAD.size))
        found = _next_sound_record(self.f, pos + 1, self.size)
        if found is None:
            raise ReadingStopped(
                f"{_record_name(head[0])} at byte {pos}: {'; '.join(known)}; no readable chunk follows: "
                "the file was cut there (or all that follows is damaged)"
            )
        self.lost.append(
            _Loss(
                f"bytes {pos} to {found}",
                f"{_record_name(head[0])}: {'; '.join(known)}; read on from the next chunk that checks out",
                unknown="the lengths of the records there are damaged",
            )
        )
        self.f.seek(found)
        return found

    def _check_data_crc(self, data_end: int, content: bytes) -> None:
        """Checks the data section's CRC (the bytes before the DataEnd record at `data_end`), if
        the writer wrote one and no damage was found on the way (then it cannot match)."""
        expected = struct.unpack_from("<I", content)[0] if len(content) >= 4 else 0
        if expected == 0 or self.lost:
            return
        # Read again rather than summed on the way: most writers write none.
        self.f.seek(0)
        crc, left = 0, data_end
        while left:
            block = self.f.read(min(left, _SCAN_BLOCK))
            crc, left = zlib.crc32(block, crc), left - len(block)
        if crc == expected:
            return
        self.lost.append(
            _Loss(
                "data section",
                "its CRC does not match, while every chunk's own check held: a record outside the chunks "
                "is damaged",
                unknown="records outside chunks carry no CRC of their own",
            )
        )


def _read_plain(opcode: int, content: bytes) -> Schema | Channel | Message:
    stream = ReadDataStream(io.BytesIO(content))
    if opcode == Opcode.MESSAGE:
        if len(content) < 22:  # channel id, sequence, log and publish times
            raise ValueError(f"{len(content)} bytes, fewer than a message's fields")
        return Message.read(stream, len(content))
    return Schema.read(stream) if opcode == Opcode.SCHEMA else Channel.read(stream)


def _count_index(loss: _Loss, content: bytes) -> None:
    """Adds the entries of one message index record to the damaged chunk it follows."""
    if loss.index_damaged:
        return
    try:
        channel_id, entries_length = struct.unpack_from("<HI", content)
        if entries_length % 16 or 6 + entries_length > len(content):
            raise ValueError
    except (ValueError, struct.error):
        # Some channel's count is unknown: no count at all rather than a part presented as all.
        loss.by_channel, loss.unknown, loss.index_damaged = None, "its message index is damaged too", True
        return
    loss.by_channel = loss.by_channel if loss.by_channel is not None else Counter()
    loss.by_channel[channel_id] += entries_length // 16  # one entry (log time, offset) per message


def _record_name(opcode: int) -> str:
    try:
        return f"a {Opcode(opcode).name.lower()} record"
    except ValueError:
        return f"a record with opcode {opcode:#04x}"


def _log_times(start: int, end: int) -> list[str]:
    """The log times a damaged chunk's header gives, if they can be a chunk's (at most a day apart)."""
    if not start <= end <= start + 86_400 * 10**9:
        return []
    return [
        f"its header gives log times {start / 1e9:.3f} s to {end / 1e9:.3f} s ({(end - start) / 1e9:.3f} s)"
    ]


def _next_sound_record(f: IO[bytes], start: int, size: int) -> int | None:
    """The offset of the first record at or after `start` that is, beyond reasonable doubt, one the
    writer wrote: a chunk that checks out (fields, decompression, and a CRC or a compressor's own
    framing), or the DataEnd record the footer points at. Only garbage that happens to pass a
    CRC or a compressor's checks is taken for one."""
    footer = _footer_at_end(f, size)
    block_start = start
    while block_start < size:
        f.seek(block_start)
        block = f.read(_SCAN_BLOCK + _HEAD.size)  # overlapping the next: a head across the boundary
        for hit in _CANDIDATE.finditer(block, 0, _SCAN_BLOCK):
            if hit.start() + _HEAD.size > len(block):
                return None  # the file ends within this head
            at = block_start + hit.start()
            opcode, length = _HEAD.unpack_from(block, hit.start())
            end = at + _HEAD.size + length
            if opcode == Opcode.DATA_END:
                if length == 4 and footer is not None and end == footer:
                    return at
            elif length <= RECORD_SIZE_LIMIT and end <= size and _sound_chunk(f, at + _HEAD.size, length):
                return at
        block_start += _SCAN_BLOCK
    return None


def _sound_chunk(f: IO[bytes], offset: int, length: int) -> bool:
    f.seek(offset)
    try:
        chunk = _read_chunk(f.read(length))
        if chunk.uncompressed_crc == 0 and chunk.compression == "":
            return False  # nothing to check it by: garbage can parse as records
        _chunk_records(chunk)
    except _DamagedChunk:
        return False
    return True


def _footer_at_end(f: IO[bytes], size: int) -> int | None:
    """Where the summary starts (just after the DataEnd record), if the file ends with a footer
    and its magic; else None (a cut file)."""
    if size < MAGIC_SIZE + _FOOTER_AT_END.size:
        return None
    f.seek(size - _FOOTER_AT_END.size)
    opcode, length, summary_start, _, _, magic = _FOOTER_AT_END.unpack(f.read(_FOOTER_AT_END.size))
    if opcode != Opcode.FOOTER or length != 20 or magic != _MAGIC:
        return None
    # Without a summary, summary_start is 0 and the footer follows the DataEnd record directly.
    return summary_start or size - _FOOTER_AT_END.size
