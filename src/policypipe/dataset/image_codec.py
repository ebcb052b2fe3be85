"""A zarr v3 codec that stores each camera frame as a JPEG.

JPEG rather than a lossless codec: measured in docs/dataset.md, "Image codec". It is registered through
zarr's `zarr.codecs` entry point (pyproject.toml), so `zarr.open` reads the store in any
environment where policypipe is installed, with nothing to import or register first.

Chunks are single frames, (1, H, W, 3) uint8 RGB, inside shards of many frames.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, NDBuffer
from zarr.core.common import parse_named_configuration

CODEC_NAME = "policypipe_jpeg"


@dataclass(frozen=True)
class JpegCodec(ArrayBytesCodec):
    is_fixed_size = False

    quality: int = 95

    def __init__(self, *, quality: int = 95) -> None:
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"JPEG quality must be 1..100, got {quality}")
        object.__setattr__(self, "quality", int(quality))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JpegCodec:
        _, configuration = parse_named_configuration(data, CODEC_NAME, require_configuration=False)
        return cls(**(configuration or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": CODEC_NAME, "configuration": {"quality": self.quality}}

    def validate(self, *, shape, dtype, chunk_grid) -> None:
        chunk = getattr(chunk_grid, "chunk_shape", None)
        if dtype.to_native_dtype() != np.uint8 or len(shape) != 4 or shape[-1] != 3:
            raise ValueError(f"{CODEC_NAME} stores uint8 (N, H, W, 3) RGB frames, not {dtype} {shape}")
        if chunk is not None and chunk[0] != 1:
            raise ValueError(f"{CODEC_NAME} needs one frame per chunk, got chunks {chunk}")

    # zarr runs a shard's chunks concurrently on its event loop; OpenCV releases the GIL, so
    # handing each frame to a thread lets a shard's frames be coded on every core.
    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        rgb = await asyncio.to_thread(decode_jpeg, chunk_bytes.as_numpy_array())
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(rgb.reshape(chunk_spec.shape))

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        frame = np.ascontiguousarray(chunk_array.as_ndarray_like()).reshape(chunk_spec.shape[-3:])
        encoded = await asyncio.to_thread(encode_jpeg, frame, self.quality)
        return chunk_spec.prototype.buffer.from_bytes(encoded)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError(f"{CODEC_NAME} output size depends on the image")


class CorruptFrameData(ValueError):
    """Stored bytes that cannot be a frame: not a JPEG, or a shard whose index checksum fails."""


def encode_jpeg(rgb: np.ndarray, quality: int) -> bytes:
    ok, encoded = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise ValueError(f"{CODEC_NAME}: OpenCV could not encode a {rgb.shape} frame")
    return encoded.tobytes()


def decode_jpeg(data: np.ndarray) -> np.ndarray:
    bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if bgr is None:
        raise CorruptFrameData(f"{CODEC_NAME}: a chunk of {len(data)} bytes is not a decodable JPEG")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
