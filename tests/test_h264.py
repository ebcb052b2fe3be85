"""libx264 takes policypipe's settings as given, and the same frames encode to the same bytes."""

from __future__ import annotations

import io

import av
import numpy as np

from policypipe import h264


def encode(frames: list[np.ndarray], params: str) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.height, stream.width = frames[0].shape[0] * 2 // 3, frames[0].shape[1]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_count = 1
        stream.options = {"crf": "18", "preset": "medium", "g": "2", "x264-params": params}
        for i, yuv in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()


def test_libx264_runs_on_one_thread_with_the_settings_and_repeats_its_bytes() -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (36, 32), dtype=np.uint8)  # I420 of 32 x 24: Y, then U and V
    frames = [np.roll(base, i, axis=1) for i in range(40)]
    params = h264.x264_params("keyint=2")
    first = encode(frames, params)
    # x264 writes the settings it used into the stream: they are ours, not its defaults.
    assert b"threads=1 lookahead_threads=1 sliced_threads=0" in first and b"keyint=2" in first
    assert all(encode(frames, params) == first for _ in range(10))


def test_the_code_paths_are_capped_only_on_a_cpu_with_avx512(monkeypatch) -> None:
    monkeypatch.setattr(h264, "_has_avx512", lambda: True)
    assert h264.x264_params("bframes=0").split(":") == [
        "bframes=0",
        *h264.ONE_THREAD.split(":"),
        "asm=MMX2,SSE2Fast,LZCNT,SSSE3,SSE4.2,AVX,FMA3,BMI2,AVX2",
    ]
    monkeypatch.setattr(h264, "_has_avx512", lambda: False)
    assert h264.x264_params() == h264.ONE_THREAD
