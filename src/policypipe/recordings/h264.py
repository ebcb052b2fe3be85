"""Just enough of the H.264 bitstream (ITU-T H.264, Annex B) to tell which pictures decode
against a reference picture that never reached the decoder.

A decoder that misses a reference picture does not say so: it conceals the hole and
decodes every later picture of the GOP against the wrong reference. The bitstream itself
says when a reference is missing: each slice header carries `frame_num`, which counts
reference pictures (7.4.3). A picture whose frame_num is neither PrevRefFrameNum (the
frame_num of the last reference picture) nor the one after it follows a lost reference
picture. Capture timestamps cannot tell this: a camera that drops a frame *before*
encoding leaves the same timestamp gap over an intact bitstream, and in a stream with
B-frames file order is not time order.

Only the headers are read: NAL unit headers, the SPS and PPS up to the fields the slice
header needs, and each picture's first slice header up to frame_num.

Known limits (each errs towards keeping frames only where the bitstream gives no sign):
- Losing a run of reference pictures that is a whole multiple of MaxFrameNum long, or a
  run that spans an IDR and ends where the new GOP's frame_num happens to continue the old
  one, cannot be seen in frame_num. A lone lost IDR shows unless the last reference picture
  before it has frame_num 0 or 1 (a GOP of at most two reference pictures).
- A stream with gaps_in_frame_num_value_allowed_flag may leave frame_num gaps on purpose;
  there a gap is not a loss and nothing is marked (losses are then invisible here).
- memory_management_control_operation 5 (which resets frame_num) lies past frame_num and
  is not read: a picture after one is marked broken until the next IDR (frames dropped,
  never wrong frames kept). Common encoders do not emit it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "NAL_IDR_SLICE",
    "NAL_PPS",
    "NAL_SLICE",
    "NAL_SPS",
    "BitReader",
    "BitstreamError",
    "MissingParameterSet",
    "NalHeader",
    "PacketCheck",
    "Pps",
    "SliceHeader",
    "Sps",
    "Verdict",
    "check_references",
    "each_reference_check",
    "is_idr",
    "nal_header",
    "nal_units",
    "parse_pps",
    "parse_slice_header",
    "parse_sps",
    "rbsp",
]

# nal_unit_type (Table 7-1).
NAL_SLICE = 1  # a slice of a non-IDR picture
NAL_SLICE_PARTITION_A = 2  # data partition A: carries the slice header (Extended profile)
NAL_IDR_SLICE = 5  # a slice of an IDR picture: nothing after it references anything before
NAL_SPS = 7
NAL_PPS = 8
_PICTURE_NALS = (NAL_SLICE, NAL_SLICE_PARTITION_A, NAL_IDR_SLICE)  # those that start with slice_header()

# Profiles whose SPS carries chroma_format_idc, bit depths and scaling lists (7.3.2.1.1).
HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})

_START_CODE = b"\x00\x00\x01"  # Annex B; the 4-byte form 00 00 00 01 ends in it
_EMULATION_PREVENTION = re.compile(b"\x00\x00\x03")
# A valid slice header up to frame_num is under 80 bits, 15 bytes with emulation prevention:
# this many bytes of escaped payload always hold it, and the slice data is never copied.
_SLICE_HEADER_PREFIX = 64
_MAX_FRAME_SIZE_IN_MBS = 139_264  # Table A-1, level 6.2: no conforming picture is larger


class BitstreamError(ValueError):
    """Bytes that are not the H.264 syntax they claim to be."""


class MissingParameterSet(LookupError):
    """A slice refers to a PPS or SPS that has not been seen: its header cannot be read past
    pic_parameter_set_id (frame_num's width is in the SPS), and a decoder cannot decode it."""


# --------------------------------------------------------------------- NAL units and bits


def nal_units(data: bytes) -> Iterator[memoryview]:
    """Each NAL unit of an Annex B byte stream (header byte + escaped payload), in order.

    Emulation prevention keeps 00 00 01 out of every NAL unit, so a plain search finds
    exactly the start codes. Zero bytes before a start code (the 4-byte form's zero_byte,
    trailing_zero_8bits) belong to no NAL unit: a NAL unit never ends in 00 (7.4.1).
    Views, not copies: a slice of a large frame is megabytes, and only its header is read.
    """
    view = memoryview(data)
    start = data.find(_START_CODE)
    while start >= 0:
        begin = start + len(_START_CODE)
        start = data.find(_START_CODE, begin)
        end = len(data) if start < 0 else start
        while end > begin and data[end - 1] == 0:
            end -= 1
        if end > begin:
            yield view[begin:end]


class NalHeader(NamedTuple):
    nal_ref_idc: int  # 0: not used for reference by any later picture
    nal_unit_type: int


def nal_header(nal: memoryview | bytes) -> NalHeader:
    first = nal[0]
    if first & 0x80:
        raise BitstreamError("forbidden_zero_bit is set")
    return NalHeader((first >> 5) & 0x03, first & 0x1F)


def rbsp(nal_payload: memoryview | bytes) -> bytes:
    """The RBSP of a NAL unit payload: every 03 that follows 00 00 is emulation prevention,
    added by the encoder so the payload never looks like a start code (7.4.1)."""
    return _EMULATION_PREVENTION.sub(b"\x00\x00", bytes(nal_payload))


class BitReader:
    """Reads u(n), ue(v) and se(v) (7.2, 9.1) from an RBSP, most significant bit first."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0  # in bits
        self._bits = len(data) * 8

    @property
    def position(self) -> int:
        return self._pos

    def u(self, n: int) -> int:
        if self._pos + n > self._bits:
            raise BitstreamError(f"read past the end of the RBSP ({self._bits} bits)")
        value = 0
        for _ in range(n):
            value = (value << 1) | ((self._data[self._pos >> 3] >> (7 - (self._pos & 7))) & 1)
            self._pos += 1
        return value

    def flag(self) -> bool:
        return bool(self.u(1))

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            # No syntax element exceeds 2^32 - 2: more leading zeros is not H.264.
            if zeros > 31:
                raise BitstreamError("Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


def _ranged(value: int, high: int, name: str) -> int:
    """Checks a value against its range in the spec: garbage that happens to parse as Exp-Golomb
    codes rarely stays in range, and an out-of-range id would index a table that does not exist."""
    if not 0 <= value <= high:
        raise BitstreamError(f"{name}={value} is outside 0..{high}")
    return value


# --------------------------------------------------------------------- parameter sets


@dataclass(frozen=True)
class Sps:
    """The fields of a sequence parameter set that reading a slice header up to frame_num, and
    judging frame_num, need."""

    sps_id: int
    profile_idc: int
    chroma_format_idc: int
    separate_colour_plane: bool  # 4:4:4 coded as three colour planes: colour_plane_id precedes frame_num
    log2_max_frame_num: int  # frame_num is u(log2_max_frame_num)
    gaps_in_frame_num_allowed: bool
    frame_mbs_only: bool
    frame_size_in_mbs: int  # macroblocks of a whole frame: first_mb_in_slice stays below it

    @property
    def max_frame_num(self) -> int:
        return 1 << self.log2_max_frame_num


@dataclass(frozen=True)
class Pps:
    pps_id: int
    sps_id: int


def _skip_scaling_list(bits: BitReader, size: int) -> None:
    """scaling_list() (7.3.2.1.1.1): delta-coded; a next scale of 0 ends the explicit entries."""
    last_scale = next_scale = 8
    for _ in range(size):
        if next_scale != 0:
            delta = bits.se()
            if not -128 <= delta <= 127:
                raise BitstreamError(f"delta_scale={delta} is outside -128..127")
            next_scale = (last_scale + delta + 256) % 256
        last_scale = next_scale if next_scale != 0 else last_scale


def parse_sps(nal: memoryview | bytes) -> Sps:
    """seq_parameter_set_data() (7.3.2.1.1) of an SPS NAL unit, up to frame_mbs_only_flag."""
    bits = BitReader(rbsp(nal[1:]))
    profile_idc = bits.u(8)
    bits.u(8)  # constraint_set0..5 flags, reserved_zero_2bits
    bits.u(8)  # level_idc
    sps_id = _ranged(bits.ue(), 31, "seq_parameter_set_id")
    chroma_format_idc, separate_colour_plane = 1, False  # 4:2:0 unless a high profile says otherwise
    if profile_idc in HIGH_PROFILES:
        chroma_format_idc = _ranged(bits.ue(), 3, "chroma_format_idc")
        if chroma_format_idc == 3:
            separate_colour_plane = bits.flag()
        _ranged(bits.ue(), 6, "bit_depth_luma_minus8")
        _ranged(bits.ue(), 6, "bit_depth_chroma_minus8")
        bits.flag()  # qpprime_y_zero_transform_bypass_flag
        if bits.flag():  # seq_scaling_matrix_present_flag
            # Six 4x4 lists, then 8x8 lists: two, or six for 4:4:4 (one per colour component).
            for i in range(8 if chroma_format_idc != 3 else 12):
                if bits.flag():  # seq_scaling_list_present_flag[i]
                    _skip_scaling_list(bits, 16 if i < 6 else 64)
    log2_max_frame_num = _ranged(bits.ue(), 12, "log2_max_frame_num_minus4") + 4
    poc_type = _ranged(bits.ue(), 2, "pic_order_cnt_type")
    if poc_type == 0:
        _ranged(bits.ue(), 12, "log2_max_pic_order_cnt_lsb_minus4")
    elif poc_type == 1:
        bits.flag()  # delta_pic_order_always_zero_flag
        bits.se()  # offset_for_non_ref_pic
        bits.se()  # offset_for_top_to_bottom_field
        for _ in range(_ranged(bits.ue(), 255, "num_ref_frames_in_pic_order_cnt_cycle")):
            bits.se()  # offset_for_ref_frame[i]
    bits.ue()  # max_num_ref_frames
    gaps_allowed = bits.flag()
    width_in_mbs = bits.ue() + 1
    height_in_map_units = bits.ue() + 1
    frame_mbs_only = bits.flag()
    # A map unit is a macroblock pair when fields may be coded (frame_mbs_only_flag = 0).
    frame_size_in_mbs = width_in_mbs * height_in_map_units * (1 if frame_mbs_only else 2)
    return Sps(
        sps_id=sps_id,
        profile_idc=profile_idc,
        chroma_format_idc=chroma_format_idc,
        separate_colour_plane=separate_colour_plane,
        log2_max_frame_num=log2_max_frame_num,
        gaps_in_frame_num_allowed=gaps_allowed,
        frame_mbs_only=frame_mbs_only,
        frame_size_in_mbs=frame_size_in_mbs,
    )


def parse_pps(nal: memoryview | bytes) -> Pps:
    """pic_parameter_set_rbsp() (7.3.2.2) of a PPS NAL unit, up to seq_parameter_set_id."""
    bits = BitReader(rbsp(nal[1 : 1 + _SLICE_HEADER_PREFIX]))
    pps_id = _ranged(bits.ue(), 255, "pic_parameter_set_id")
    return Pps(pps_id=pps_id, sps_id=_ranged(bits.ue(), 31, "seq_parameter_set_id"))


# --------------------------------------------------------------------- slice headers


@dataclass(frozen=True)
class SliceHeader:
    """A slice's NAL header and its slice_header() (7.3.3) up to frame_num."""

    nal_ref_idc: int
    nal_unit_type: int
    first_mb_in_slice: int
    slice_type: int  # 0..9: P, B, I, SP, SI; +5 says every slice of the picture has that type
    pps_id: int
    colour_plane_id: int | None  # only with separate_colour_plane_flag
    frame_num: int

    @property
    def idr(self) -> bool:
        return self.nal_unit_type == NAL_IDR_SLICE

    @property
    def reference(self) -> bool:
        """Whether later pictures may reference this one: only then does losing it matter."""
        return self.nal_ref_idc != 0


_INTRA_SLICE_TYPES = frozenset({2, 4, 7, 9})  # I, SI


def parse_slice_header(
    nal: memoryview | bytes, pps: Mapping[int, Pps], sps: Mapping[int, Sps]
) -> SliceHeader:
    """The header of a slice NAL unit, read with the parameter sets known so far.

    Raises MissingParameterSet when its PPS, or that PPS's SPS, is unknown, BitstreamError when
    the bytes are not a slice header.
    """
    nal_ref_idc, nal_unit_type = nal_header(nal)
    if nal_unit_type not in _PICTURE_NALS:
        raise BitstreamError(f"nal_unit_type {nal_unit_type} is not a slice")
    bits = BitReader(rbsp(nal[1 : 1 + _SLICE_HEADER_PREFIX]))
    first_mb_in_slice = _ranged(bits.ue(), _MAX_FRAME_SIZE_IN_MBS - 1, "first_mb_in_slice")
    slice_type = _ranged(bits.ue(), 9, "slice_type")
    pps_id = _ranged(bits.ue(), 255, "pic_parameter_set_id")
    if pps_id not in pps:
        raise MissingParameterSet(f"slice refers to PPS {pps_id}, which has not been seen")
    sps_id = pps[pps_id].sps_id
    if sps_id not in sps:
        raise MissingParameterSet(f"PPS {pps_id} refers to SPS {sps_id}, which has not been seen")
    active = sps[sps_id]
    if first_mb_in_slice >= active.frame_size_in_mbs:
        raise BitstreamError(
            f"first_mb_in_slice={first_mb_in_slice} lies outside a "
            f"{active.frame_size_in_mbs}-macroblock picture"
        )
    colour_plane_id = bits.u(2) if active.separate_colour_plane else None
    frame_num = bits.u(active.log2_max_frame_num)
    if nal_unit_type == NAL_IDR_SLICE:
        # An IDR picture is intra, a reference, and restarts frame_num (7.4.1.2.4, 7.4.3).
        if nal_ref_idc == 0 or frame_num != 0 or slice_type not in _INTRA_SLICE_TYPES:
            raise BitstreamError(
                f"IDR slice with nal_ref_idc={nal_ref_idc}, frame_num={frame_num}, slice_type={slice_type}"
            )
    return SliceHeader(
        nal_ref_idc=nal_ref_idc,
        nal_unit_type=nal_unit_type,
        first_mb_in_slice=first_mb_in_slice,
        slice_type=slice_type,
        pps_id=pps_id,
        colour_plane_id=colour_plane_id,
        frame_num=frame_num,
    )


def is_idr(packet: bytes) -> bool:
    """Whether the packet holds an IDR picture.

    Only the first slice is looked at: the slices of one picture are all IDR or none, and the
    search stops before the slice data.
    """
    for nal in nal_units(packet):
        nal_unit_type = nal[0] & 0x1F
        if nal_unit_type in _PICTURE_NALS:
            return nal_unit_type == NAL_IDR_SLICE
    return False


# --------------------------------------------------------------------- reference tracking


class Verdict(enum.Enum):
    INTACT = "intact"  # a picture whose references all reached the decoder
    BROKEN = (
        "broken"  # a picture after a lost reference picture, before the first IDR, or without parameter sets
    )
    UNREADABLE = "unreadable"  # empty, or bytes that are not the H.264 they claim to be: treat as lost
    NO_PICTURE = "no_picture"  # readable, but without a slice (e.g. only SPS/PPS/SEI)


class PacketCheck(NamedTuple):
    verdict: Verdict
    idr: bool  # an IDR picture that can be decoded: references are whole again from here


@dataclass
class _Tracker:
    """The state a decoder's reference pictures are in, followed through the packets in decode
    order (8.2.5.2, the frame_num gap check)."""

    sps: dict[int, Sps]
    pps: dict[int, Pps]
    intact: bool = False  # nothing to reference until the first IDR
    prev_ref_frame_num: int = 0

    def check(self, packet: bytes) -> PacketCheck:
        if not packet:
            return PacketCheck(Verdict.UNREADABLE, False)
        # Parameter sets of the packet apply to its own slices, but are kept only if the
        # whole packet reads: an unreadable packet never reaches the decoder either.
        sps, pps = dict(self.sps), dict(self.pps)
        picture: SliceHeader | None = None
        try:
            for nal in nal_units(packet):
                nal_unit_type = nal_header(nal).nal_unit_type
                if nal_unit_type == NAL_SPS:
                    new_sps = parse_sps(nal)
                    sps[new_sps.sps_id] = new_sps
                elif nal_unit_type == NAL_PPS:
                    new_pps = parse_pps(nal)
                    pps[new_pps.pps_id] = new_pps
                elif nal_unit_type in _PICTURE_NALS and picture is None:
                    # One picture per packet: its first slice speaks for all of them.
                    picture = parse_slice_header(nal, pps, sps)
        except MissingParameterSet:
            if not self.intact:
                # Expected after a loss or at a start mid-stream: the parameter sets came before.
                self.sps, self.pps = sps, pps
                return PacketCheck(Verdict.BROKEN, False)
            return self._unreadable(packet)
        except BitstreamError:
            return self._unreadable(packet)
        self.sps, self.pps = sps, pps
        if picture is None:
            return PacketCheck(Verdict.NO_PICTURE, False)
        return PacketCheck(self._judge(picture, sps[pps[picture.pps_id].sps_id]), picture.idr)

    def _judge(self, picture: SliceHeader, active: Sps) -> Verdict:
        if picture.idr:
            self.intact, self.prev_ref_frame_num = True, 0
            return Verdict.INTACT
        if not self.intact:
            return Verdict.BROKEN
        expected = (self.prev_ref_frame_num, (self.prev_ref_frame_num + 1) % active.max_frame_num)
        # With gaps allowed an encoder may skip frame_num values on purpose (7.4.3): a gap is
        # then no evidence of a loss, and marking it would drop good frames.
        if picture.frame_num not in expected and not active.gaps_in_frame_num_allowed:
            self.intact = False  # a reference picture was lost: broken until the next IDR
            return Verdict.BROKEN
        if picture.reference:
            self.prev_ref_frame_num = picture.frame_num
        return Verdict.INTACT

    def _unreadable(self, packet: bytes) -> PacketCheck:
        """An unreadable packet is not decoded: if it says it holds a reference picture, the
        pictures after it lose that reference. If it does not say (or cannot), frame_num of the
        next picture tells whether a reference went missing."""
        for nal in nal_units(packet):
            first = nal[0]
            if (first & 0x1F) in _PICTURE_NALS and not (first & 0x80):
                if (first >> 5) & 0x03:  # nal_ref_idc
                    self.intact = False
                break
        return PacketCheck(Verdict.UNREADABLE, False)


def check_references(packets: Sequence[bytes]) -> list[PacketCheck]:
    """One verdict per packet (one access unit each, in decode order, i.e. file order).

    BROKEN: the picture decodes against a reference picture that was lost (a frame_num gap
    after the last reference picture), or has nothing to reference (before the first IDR),
    or its parameter sets are missing; every picture after such a loss is BROKEN until an
    IDR whose parameter sets are known. A lost non-reference picture (nal_ref_idc = 0, e.g.
    a B-frame nothing refers to) breaks nothing. UNREADABLE packets are not decodable on
    their own account and count as lost for the pictures after them.
    """
    return [check for _, check in each_reference_check(packets)]


def each_reference_check(packets: Iterable[bytes]) -> Iterator[tuple[bytes, PacketCheck]]:
    """Each packet with its `check_references` verdict, one at a time, in one pass over
    `packets`: a decoder loop checks and decodes as it reads, never reading the stream twice."""
    tracker = _Tracker(sps={}, pps={})
    for packet in packets:
        yield packet, tracker.check(packet)
