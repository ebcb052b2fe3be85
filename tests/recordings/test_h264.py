"""H.264 reference tracking on real libx264 streams, and on hand-written headers for the
syntax libx264 never writes."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo

from policypipe.dataset.episode import build_episode, decode_frames, missing_frames
from policypipe.recordings import h264
from policypipe.recordings.h264 import (
    BitReader,
    BitstreamError,
    Verdict,
    check_references,
    is_idr,
    nal_header,
    nal_units,
    parse_pps,
    parse_slice_header,
    parse_sps,
    rbsp,
)
from policypipe.recordings.streams import Streams
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.recording import StreamTiming, simulate_recording
from tests.dataset.test_episode import CONFIG, T0, h264_packets, make_streams

INTACT, BROKEN, UNREADABLE = Verdict.INTACT, Verdict.BROKEN, Verdict.UNREADABLE
HZ = 30.0


def frame(i: int, size: tuple[int, int] = (64, 48)) -> np.ndarray:
    """Every frame differs from the last (brightness and a moving bar): a frame decoded against
    the wrong reference shows it."""
    w, h = size
    bgr = np.full((h, w, 3), 8 * (i % 30), np.uint8)
    bgr[:, (5 * i) % w] = 255
    bgr[(3 * i) % h, :, 1] = 0
    return bgr


def encode(
    indices: list[int], *, bframes: int = 0, pix_fmt: str = "yuv420p"
) -> tuple[list[bytes], list[int]]:
    """libx264, an IDR every 10 frames: (packets in decode order, each packet's frame index).

    With B-frames ("veryfast": High profile, B-pyramid) the middle B of each pair is a
    reference picture and the other is not.
    """
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height = 64, 48
    ctx.pix_fmt = pix_fmt
    ctx.time_base, ctx.framerate = Fraction(1, 10), Fraction(10, 1)
    ctx.gop_size, ctx.max_b_frames, ctx.thread_count = 10, bframes, 1
    ctx.options = {
        "preset": "veryfast" if bframes else "ultrafast",
        "crf": "23",
        "x264-params": "keyint=10:min-keyint=10:scenecut=0:"
        f"bframes={bframes}:repeat-headers=1:threads=1:sliced-threads=0",
    }
    packets: list[av.Packet] = []
    for pts, i in enumerate(indices):
        video = av.VideoFrame.from_ndarray(frame(i), format="bgr24").reformat(format=pix_fmt)
        video.pts = pts
        packets += ctx.encode(video)
    packets += ctx.encode(None)
    return [bytes(p) for p in packets], [indices[int(p.pts)] for p in packets]


def capture_ns(indices: list[int]) -> np.ndarray:
    """Capture time of each frame index on a 30 Hz clock."""
    return T0 + np.round((0.1 + np.asarray(indices) / HZ) * 1e9).astype(np.int64)


def verdicts(packets: list[bytes]) -> list[Verdict]:
    return [check.verdict for check in check_references(packets)]


def first_slice(packets: list[bytes]) -> list[h264.SliceHeader]:
    """The first slice header of each packet, with the parameter sets seen so far."""
    sps: dict[int, h264.Sps] = {}
    pps: dict[int, h264.Pps] = {}
    headers = []
    for packet in packets:
        for nal in nal_units(packet):
            kind = nal_header(nal).nal_unit_type
            if kind == h264.NAL_SPS:
                new_sps = parse_sps(nal)
                sps[new_sps.sps_id] = new_sps
            elif kind == h264.NAL_PPS:
                new_pps = parse_pps(nal)
                pps[new_pps.pps_id] = new_pps
            elif kind in (h264.NAL_SLICE, h264.NAL_IDR_SLICE):
                headers.append(parse_slice_header(nal, pps, sps))
                break
    return headers


# ---------------------------------------------------------------- bits


def test_exp_golomb_and_fixed_width_fields() -> None:
    # 1 | 010 | 011 | 00100 | 00101 | 1 0 1 | 0001000 -> ue 0, 1, 2, 3; se -2; u(3) 5; ue 7
    bits = BitReader(bytes([0b10100110, 0b01000010, 0b11010001, 0b00000000]))
    assert [bits.ue(), bits.ue(), bits.ue(), bits.ue(), bits.se(), bits.u(3), bits.ue()] == [
        0,
        1,
        2,
        3,
        -2,
        5,
        7,
    ]
    with pytest.raises(BitstreamError):
        BitReader(b"\x00\x00\x00\x00\x00").ue()  # more than 32 leading zeros
    with pytest.raises(BitstreamError):
        BitReader(b"\x01").u(9)


def test_emulation_prevention_bytes_are_removed() -> None:
    assert rbsp(b"\x00\x00\x03\x01\x00\x00\x03\x00\x00\x03") == b"\x00\x00\x01\x00\x00\x00\x00"
    assert rbsp(b"\x00\x03\x00\x00\x03\x03") == b"\x00\x03\x00\x00\x03"  # one zero, then a real 03


def test_nal_units_split_on_both_start_code_forms() -> None:
    data = b"\x00\x00\x00\x01\x67ab\x00\x00\x01\x68c\x00\x00\x00\x00\x01\x65d\x00\x00"
    assert [bytes(n) for n in nal_units(data)] == [b"\x67ab", b"\x68c", b"\x65d"]
    assert list(nal_units(b"")) == [] and list(nal_units(b"\x00\x00\x01")) == []


def test_idr_packets_are_found_by_their_nal_units() -> None:
    packets = h264_packets(25)
    assert [i for i, p in enumerate(packets) if is_idr(p)] == [0, 10, 20]
    # 3- and 4-byte start codes; SPS (7) and PPS (8) before the slice do not count, the slice does.
    assert is_idr(b"\x00\x00\x00\x01\x67sps\x00\x00\x01\x68pps\x00\x00\x01\x65slice")
    assert not is_idr(b"\x00\x00\x00\x01\x67sps\x00\x00\x01\x41slice")
    assert not is_idr(b"") and not is_idr(b"\x00\x00\x01")


# ---------------------------------------------------------------- real streams


@pytest.mark.parametrize(
    ("bframes", "pix_fmt", "profile_idc", "chroma_format_idc"),
    [(0, "yuv420p", 66, 1), (2, "yuv420p", 100, 1), (0, "yuv444p", 244, 3)],
    ids=["baseline", "high-bframes", "high444"],
)
def test_real_stream_headers(bframes: int, pix_fmt: str, profile_idc: int, chroma_format_idc: int) -> None:
    packets, index = encode(list(range(25)), bframes=bframes, pix_fmt=pix_fmt)
    sps = parse_sps(next(n for n in nal_units(packets[0]) if nal_header(n).nal_unit_type == h264.NAL_SPS))
    assert (sps.profile_idc, sps.chroma_format_idc, sps.separate_colour_plane) == (
        profile_idc,
        chroma_format_idc,
        False,
    )
    assert sps.frame_mbs_only and not sps.gaps_in_frame_num_allowed and sps.frame_size_in_mbs == 4 * 3
    assert sps.max_frame_num >= 10  # no wrap within a GOP

    headers = first_slice(packets)
    assert len(headers) == len(packets) == 25
    assert [index[k] for k, s in enumerate(headers) if s.idr] == [0, 10, 20]
    assert all(s.first_mb_in_slice == 0 and s.colour_plane_id is None for s in headers)
    # frame_num counts reference pictures since the IDR; a non-reference one takes the next value.
    prev = 0
    for s in headers:
        assert s.frame_num == (0 if s.idr else prev + 1)
        prev = s.frame_num if s.reference else prev
    assert any(not s.reference for s in headers) == (bframes > 0)
    assert verdicts(packets) == [INTACT] * 25


# ---------------------------------------------------------------- losses


def decode_kept(packets: list[bytes], index: list[int]) -> tuple[list[str | None], np.ndarray]:
    """Decodes the packets as camera messages, each with its frame's capture time."""
    streams = make_streams(camera_ns=capture_ns(index), camera_data=packets, camera_format="h264")
    decoded = decode_frames(streams.cameras[0], (64, 48))
    return decoded.dropped, decoded.rgb


@pytest.mark.parametrize("bframes", [0, 2], ids=["p-only", "bframes"])
def test_lost_reference_picture_breaks_the_pictures_after_it_until_the_next_idr(bframes: int) -> None:
    packets, index = encode(list(range(30)), bframes=bframes)
    refs = first_slice(packets)
    lost = next(k for k in range(12, 18) if refs[k].reference and not refs[k].idr)
    next_idr = next(k for k in range(lost, 30) if refs[k].idr)
    kept = [k for k in range(30) if k != lost]

    got = verdicts([packets[k] for k in kept])

    broken = [kept[j] for j, v in enumerate(got) if v is BROKEN]
    assert broken == list(range(lost + 1, next_idr)) and set(got) == {INTACT, BROKEN}
    # The frames kept are exactly those of the loss-free decode; the broken ones really decode wrong.
    whole_dropped, whole = decode_kept(packets, index)
    dropped, rgb = decode_kept([packets[k] for k in kept], [index[k] for k in kept])
    assert whole_dropped == [None] * 30
    assert dropped == [("h264_reference_lost" if k in broken else None) for k in kept]
    for j, k in enumerate(kept):
        if k not in broken:
            assert np.array_equal(rgb[j], whole[k]), f"packet {k}"
    damaged = plain_decode([packets[k] for k in kept])
    assert any(
        not np.array_equal(damaged[j], whole[k]) for j, k in enumerate(kept) if k in broken and j in damaged
    )


def plain_decode(packets: list[bytes]) -> dict[int, np.ndarray]:
    """Packet position -> what a decoder makes of it, with no idea which references were lost."""
    codec = av.CodecContext.create("h264", "r")
    frames: dict[int, np.ndarray] = {}
    for position, data in enumerate([*packets, None]):
        packet = None if data is None else av.Packet(data)
        if packet is not None:
            packet.pts = position
        frames |= {int(f.pts): f.to_ndarray(format="rgb24") for f in codec.decode(packet)}
    return frames


def test_lost_non_reference_picture_breaks_nothing() -> None:
    """A dropped B-frame that nothing references: every other frame is kept, unchanged, though
    capture times in file order jump back and forth (B-frames: file order is not time order)."""
    packets, index = encode(list(range(30)), bframes=2)
    headers = first_slice(packets)
    lost = [k for k, s in enumerate(headers) if not s.reference]
    assert len(lost) >= 4
    kept = [k for k in range(30) if k not in lost[1:4]]

    assert verdicts([packets[k] for k in kept]) == [INTACT] * len(kept)

    streams = make_streams(
        camera_ns=capture_ns([index[k] for k in kept]),
        camera_data=[packets[k] for k in kept],
        camera_format="h264",
    )
    ep = build_episode(streams, CONFIG)
    assert "h264_reference_lost" not in ep.dropped and "undecodable" not in ep.dropped
    assert np.array_equal(ep.capture_ns, np.sort(capture_ns([index[k] for k in kept])))
    whole = build_episode(
        make_streams(camera_ns=capture_ns(index), camera_data=packets, camera_format="h264"), CONFIG
    )
    assert np.array_equal(ep.rgb, whole.rgb[np.isin(whole.capture_ns, ep.capture_ns)])


def test_frames_the_camera_dropped_before_encoding_keep_every_frame() -> None:
    """Capture times with gaps over an intact bitstream: the camera never delivered those
    frames, nothing is missing from the stream, and every frame decodes as encoded."""
    shown = [i for i in range(60) if i not in (7, 15, 16, 33, 48)]
    packets, index = encode(shown)
    streams = make_streams(camera_ns=capture_ns(index), camera_data=packets, camera_format="h264")

    ep = build_episode(streams, CONFIG)

    assert ep.dropped == {} and np.array_equal(ep.capture_ns, capture_ns(shown))
    assert ep.camera_gaps == 5
    dropped, rgb = decode_kept(packets, index)
    truth = plain_decode(packets)
    assert dropped == [None] * len(shown) and all(np.array_equal(rgb[k], truth[k]) for k in range(len(shown)))


def test_simulated_recording_with_dropped_camera_frames_decodes_every_frame() -> None:
    """The sample simulator drops frames before encoding, as a real camera does."""
    rng = np.random.default_rng(3)
    plan = plan_motion(rng, T0, duration_s=3.0)
    rec = simulate_recording(
        plan, StreamTiming(camera_drop_fraction=0.05), rng, camera="video", image_size=(64, 48)
    )
    assert rec.truth.dropped_frames > 0 and missing_frames(rec.truth.camera_ns) > 0
    payloads = [CompressedVideo.FromString(m.data).data for m in rec.vio_messages if m.channel == "video"]
    position, quat = plan.pose_at(rec.truth.pose_ns)
    streams = Streams.of_one_gripper(
        camera_ns=rec.truth.camera_ns,
        camera_data=payloads,
        camera_format="h264",
        pose_ns=rec.truth.pose_ns,
        position=position,
        quaternion=quat,
        width_ns=rec.truth.width_ns,
        width=plan.width_at(rec.truth.width_ns),
        truncated=None,
    )

    assert verdicts(payloads) == [INTACT] * rec.truth.frames
    ep = build_episode(streams, CONFIG)
    assert set(ep.dropped) <= {"outside_pose_or_width_span"}
    assert len(ep.capture_ns) + sum(ep.dropped.values()) == rec.truth.frames


def test_stream_starting_mid_gop_is_broken_until_the_first_idr() -> None:
    packets, _ = encode(list(range(25)))
    # Without the parameter sets, and with them (a camera that repeats SPS/PPS on every packet).
    assert verdicts(packets[3:]) == [BROKEN] * 7 + [INTACT] * 15
    headers = b"".join(
        b"\x00\x00\x00\x01" + bytes(n) for n in nal_units(packets[0]) if nal_header(n).nal_unit_type in (7, 8)
    )
    assert verdicts([headers + packets[3], *packets[4:]]) == [BROKEN] * 7 + [INTACT] * 15


def test_unreadable_packets_are_reported_and_count_as_lost() -> None:
    packets, _ = encode(list(range(20)))
    garbage = b"\x00\x00\x01\x41" + bytes(range(256)) * 4  # a "reference" slice that is noise
    damaged = [*packets[:3], b"", *packets[3:5], garbage, *packets[5:]]
    # The empty packet hides nothing (packet 3 follows in frame_num order); the garbage
    # claims to be a reference picture that the decoder never gets.
    assert (
        verdicts(damaged)
        == [INTACT] * 3 + [UNREADABLE] + [INTACT] * 2 + [UNREADABLE] + [BROKEN] * 5 + [INTACT] * 10
    )
    # An IDR without its slice data: its parameter sets are dropped with it, what follows is broken.
    cut = packets[10][: packets[10].rfind(b"\x00\x00\x01") + 4]
    assert verdicts([*packets[:10], cut, *packets[11:]]) == [INTACT] * 10 + [UNREADABLE] + [BROKEN] * 9


# ---------------------------------------------------------------- syntax libx264 does not write


class BitWriter:
    def __init__(self) -> None:
        self.bits: list[int] = []

    def u(self, n: int, value: int) -> BitWriter:
        self.bits += [(value >> (n - 1 - k)) & 1 for k in range(n)]
        return self

    def ue(self, value: int) -> BitWriter:
        n = (value + 1).bit_length()
        return self.u(n - 1, 0).u(n, value + 1)

    def se(self, value: int) -> BitWriter:
        return self.ue(2 * value - 1 if value > 0 else -2 * value)

    def nal(self, header: int) -> bytes:
        """The NAL unit with rbsp_trailing_bits and emulation prevention, after a start code."""
        bits = [*self.bits, 1] + [0] * (-(len(self.bits) + 1) % 8)
        raw = bytes(int("".join(map(str, bits[k : k + 8])), 2) for k in range(0, len(bits), 8))
        out, zeros = bytearray(), 0
        for byte in raw:
            if zeros >= 2 and byte <= 3:
                out.append(3)
                zeros = 0
            out.append(byte)
            zeros = zeros + 1 if byte == 0 else 0
        return b"\x00\x00\x00\x01" + bytes([header]) + bytes(out)


def high444_sps(*, gaps: bool = False, log2_max_frame_num: int = 4) -> bytes:
    """High 4:4:4 with separate colour planes, 10-bit, SPS scaling lists and POC type 1."""
    w = BitWriter().u(8, 244).u(8, 0).u(8, 40).ue(3)  # profile, constraints, level, sps_id 3
    w.ue(3).u(1, 1).ue(2).ue(2).u(1, 0)  # chroma_format_idc 3, separate_colour_plane, bit depths, bypass
    w.u(1, 1)  # seq_scaling_matrix_present_flag: 12 lists for 4:4:4
    for i in range(12):
        w.u(1, i in (0, 6, 9))
        if i == 0:
            for delta in (5, -3, 0, 7, -8, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1):
                w.se(delta)
        elif i == 6:
            w.se(-8)  # next scale 0 after one entry: the rest repeat it
        elif i == 9:
            for k in range(64):
                w.se(1 if k % 2 else -1)
    w.ue(log2_max_frame_num - 4).ue(1).u(1, 0).se(-2).se(1).ue(2).se(4).se(-4)  # frame_num bits, POC type 1
    w.ue(4).u(1, gaps).ue(79).ue(44).u(1, 0)  # refs, gaps, 80x45 map units, fields allowed
    return w.nal(0x67)


def pps(pps_id: int = 5, sps_id: int = 3) -> bytes:
    return BitWriter().ue(pps_id).ue(sps_id).u(1, 1).u(1, 0).nal(0x68)


def slice_nal(
    frame_num: int, *, idr: bool = False, ref: bool = True, pps_id: int = 5, log2_max_frame_num: int = 4
) -> bytes:
    w = BitWriter().ue(0).ue(7 if idr else 5).ue(pps_id).u(2, 2).u(log2_max_frame_num, frame_num)
    w.u(8, 0)  # the rest of the slice, which is not read
    return w.nal((0x60 if ref else 0x00) | (5 if idr else 1))


def test_high_profile_sps_with_scaling_lists_and_colour_planes() -> None:
    sps = parse_sps(next(nal_units(high444_sps(log2_max_frame_num=7))))
    assert (sps.sps_id, sps.profile_idc, sps.chroma_format_idc, sps.separate_colour_plane) == (
        3,
        244,
        3,
        True,
    )
    assert (sps.log2_max_frame_num, sps.frame_mbs_only, sps.frame_size_in_mbs) == (7, False, 80 * 45 * 2)
    header = parse_slice_header(
        next(nal_units(slice_nal(100, log2_max_frame_num=7))),
        {5: parse_pps(next(nal_units(pps())))},
        {3: sps},
    )
    assert (header.slice_type, header.pps_id, header.colour_plane_id, header.frame_num, header.reference) == (
        5,
        5,
        2,
        100,
        True,
    )


def synthetic(frame_nums: list[int | str], *, gaps: bool = False) -> list[bytes]:
    """Packets of an IDR with parameter sets, then one slice per entry: a frame_num of a
    reference picture, or "nN" for a non-reference picture with frame_num N."""
    stream = [high444_sps(gaps=gaps) + pps() + slice_nal(0, idr=True)]
    for entry in frame_nums:
        ref = not isinstance(entry, str)
        stream.append(slice_nal(int(entry) if ref else int(entry[1:]), ref=ref))
    return stream


def test_frame_num_wraps_and_non_reference_pictures_repeat_it() -> None:
    frame_nums: list[int | str] = [*range(1, 16), 0, "n1", "n1", 1, 2]  # MaxFrameNum 16
    assert verdicts(synthetic(frame_nums)) == [INTACT] * 21


def test_frame_num_gap_is_a_loss_unless_the_sps_allows_gaps() -> None:
    frame_nums: list[int | str] = [1, 2, 4, 5, "n6"]
    assert verdicts(synthetic(frame_nums)) == [INTACT] * 3 + [BROKEN] * 3
    # gaps_in_frame_num_value_allowed_flag: the encoder may skip values on purpose, so a gap
    # is no evidence of a loss (and losses cannot be seen in frame_num at all).
    assert verdicts(synthetic(frame_nums, gaps=True)) == [INTACT] * 6


def test_slice_with_an_unknown_pps_is_unreadable_in_an_intact_stream() -> None:
    stream = synthetic([1, 2])
    stream.insert(2, slice_nal(2, pps_id=9))  # a reference picture no decoder can decode
    assert verdicts(stream) == [INTACT, INTACT, UNREADABLE, BROKEN]
    # Once the references are broken anyway, a missing PPS is one more sign of the loss.
    assert verdicts(stream[1:]) == [BROKEN] * 3
