"""Reading MCAP files record by record, without a summary (`sequential_messages`), on the real
public files in shared/mcap-samples: intact, they read as the mcap library reads them; with their
summary cut off and one chunk damaged, only that chunk is lost, and it is counted."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest
from mcap.data_stream import ReadDataStream
from mcap.reader import NonSeekingReader, make_reader
from mcap.records import Chunk, Message
from mcap.stream_reader import breakup_chunk

from policypipe.recordings.mcap_chunks import ChunkLosses, LostChunk, chunk_summary, sequential_messages
from policypipe.recordings.messages import RecordingError, Topics
from policypipe.recordings.streams import read_streams
from tests.conftest import mcap_samples

MAGIC = b"\x89MCAP0\r\n"


def read_sequentially(path: Path) -> tuple[list[tuple[str, str, int, bytes]], ChunkLosses]:
    losses = ChunkLosses()
    with open(path, "rb") as f:
        messages = [
            (s.name if s else "", c.topic, m.log_time, m.data) for s, c, m in sequential_messages(f, losses)
        ]
    return messages, losses


def test_every_real_public_mcap_reads_record_by_record_as_the_mcap_library_reads_it() -> None:
    samples = sorted(mcap_samples().rglob("*.mcap"))
    assert len(samples) >= 15, f"expected the 15 shared MCAP samples or more, found {len(samples)}"
    for sample in samples:
        with open(sample, "rb") as f:
            expected = [
                (s.name if s else "", c.topic, m.log_time, m.data)
                for s, c, m in NonSeekingReader(f, validate_crcs=True).iter_messages(log_time_order=False)
            ]

        messages, losses = read_sequentially(sample)

        # Data section CRCs (most conformance files have one) hold too: nothing reported.
        assert messages == expected, sample.name
        assert losses == ChunkLosses(), sample.name


def without_summary(src: Path, dst: Path) -> Path:
    """The file's own bytes up to and with its DataEnd record, then a footer that points at no
    summary, and the magic: what a writer that never indexes leaves."""
    data = src.read_bytes()
    footer = len(data) - len(MAGIC) - (1 + 8 + 20)
    summary_start = struct.unpack_from("<Q", data, footer + 1 + 8)[0]
    dst.write_bytes(data[:summary_start] + struct.pack("<BQQQI", 0x02, 20, 0, 0, 0) + MAGIC)
    return dst


def chunks_of(path: Path) -> list[tuple[int, int, list[tuple[str, str, int, bytes]]]]:
    """Per chunk, in file order, from the file's summary: offset, length, messages."""
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
        out = []
        for index in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
            f.seek(index.chunk_start_offset + 1 + 8)
            messages = []
            for r in breakup_chunk(Chunk.read(ReadDataStream(f))):
                if isinstance(r, Message):
                    channel = summary.channels[r.channel_id]
                    schema = summary.schemas.get(channel.schema_id)
                    messages.append((schema.name if schema else "", channel.topic, r.log_time, r.data))
            out.append((index.chunk_start_offset, index.chunk_length, messages))
    return out


@pytest.mark.parametrize("where", ["records", "crc field"])
def test_a_real_file_without_its_summary_loses_only_its_damaged_chunk_2(tmp_path: Path, where: str) -> None:
    # A real web-demo recording: 5 zstd chunks with CRCs, a message index after each.
    sample = next(mcap_samples().rglob("rerun_simple-protobuf.mcap"))
    chunks = chunks_of(sample)
    assert len(chunks) == 5
    path = without_summary(sample, tmp_path / "r_vio.mcap")
    with open(path, "rb") as f:
        assert chunk_summary(f, path) is None
    offset, length, lost_messages = chunks[1]
    at = offset + length // 2 if where == "records" else offset + 1 + 8 + 24  # the CRC field
    data = bytearray(path.read_bytes())
    data[at : at + 4] = bytes(b ^ 0xFF for b in data[at : at + 4])
    path.write_bytes(bytes(data))

    messages, losses = read_sequentially(path)

    assert messages == [m for i, (_, _, ms) in enumerate(chunks) if i != 1 for m in ms]
    (chunk,) = losses.chunks
    assert chunk == LostChunk(
        f"chunk at byte {offset}",
        chunk.why,
        Counter(topic for _, topic, _, _ in lost_messages),
        chunk.unknown,
    )
    assert chunk.why.startswith(
        "CRC mismatch" if where == "crc field" else ("CRC mismatch", "cannot decompress")
    )
    assert f"bytes {offset} to {offset + length}" in chunk.why
    assert losses.unindexed is None and not losses.unattributed
    # Not a gripper recording: excluded, and the reason says the file was damaged too.
    with pytest.raises(RecordingError, match=f"the file is damaged: chunk at byte {offset}: .*: lost "):
        read_streams(path, Topics())
