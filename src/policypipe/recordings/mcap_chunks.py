"""Chunk-level recovery in an indexed MCAP file: each chunk's decompression and CRC are checked,
a damaged chunk is skipped and its messages are counted as lost (from its message index, or
from the summary's statistics), and reading goes on with the next chunk.
"""

from __future__ import annotations

import io
import logging
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
from mcap.stream_reader import MAGIC_SIZE, CRCValidationError, StreamReader, breakup_chunk
from mcap.summary import Summary

log = logging.getLogger(__name__)


@dataclass
class ChunkLosses:
    """Messages lost with damaged chunks: (chunk offset, why, lost messages by topic, or None if
    the chunk has no message index), and those of unindexed chunks, from the summary's statistics."""

    chunks: list[tuple[int, str, Counter[str] | None]] = field(default_factory=list)
    unindexed: Counter[str] | None = None


RECORD_SIZE_LIMIT = 1 << 30


# ---------------------------------------------------------------- chunk by chunk through the index


def chunk_summary(f: IO[bytes], path: Path) -> Summary | None:
    """The summary, if the file has one that indexes chunks and names channels, and whose CRC
    (when written) holds; else None, and the file is read in one pass."""
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
    # may sit in a damaged chunk: one pass it is.
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
            records = _chunk_records(f, index)
        except _DamagedChunk as damaged:
            by_channel = _indexed_counts(f, index)
            if by_channel is None:
                unindexed = True
            else:
                known_lost.update(by_channel)
            # Lost on a FrameTransform pose topic counts every transform, of any child frame.
            lost = None if by_channel is None else _by_topic(channels, by_channel)
            losses.chunks.append((index.chunk_start_offset, str(damaged), lost))
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


class _DamagedChunk(Exception):
    pass


def _chunk_records(f: IO[bytes], index: ChunkIndex) -> list:
    """All records of one chunk, after checking its framing, decompression and CRC (when the
    writer wrote one): a damaged chunk yields nothing rather than a part of its messages."""
    f.seek(index.chunk_start_offset)
    raw = f.read(index.chunk_length)
    if len(raw) != index.chunk_length:
        raise _DamagedChunk("cut short")
    stream = ReadDataStream(io.BytesIO(raw))
    opcode, length = stream.read1(), stream.read8()
    if opcode != Opcode.CHUNK or length != index.chunk_length - 9:
        raise _DamagedChunk(f"not the chunk the index describes (opcode {opcode:#x}, length {length})")
    try:
        chunk = Chunk.read(stream)
        if len(chunk.data) != index.compressed_size or chunk.compression != index.compression:
            raise _DamagedChunk("chunk header differs from its index")
        return breakup_chunk(chunk, validate_crc=True)
    except _DamagedChunk:
        raise
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
