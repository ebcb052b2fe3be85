"""The libx264 settings every H.264 writer in policypipe passes, so the same frames give the same bytes.

One thread is not enough. On a CPU with AVX-512, libx264 (core 165, as PyAV 18 bundles it) chose its
AVX-512 code paths, and then encoding the same 743 frames of 32 x 24 pixels twice in one process gave
other bytes in about one run in 25 (4 of 100 in one measurement, the first differing packet the
same frame each time). With the same settings and the code paths capped at AVX2, 0 of 400 runs
differed. The cause inside libx264 was not found (valgrind, which runs it without AVX-512, reports
nothing). So on such a CPU the encoder is
told which instruction sets it may use, all of them ones every AVX-512 CPU has; elsewhere libx264
detects the CPU itself, as it always has.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

ONE_THREAD = "threads=1:lookahead-threads=1:sliced-threads=0"

# libx264's names for the instruction sets up to AVX2 (its `asm` option; each implies those it
# builds on). Every CPU with AVX-512 has them all.
_UP_TO_AVX2 = "MMX2,SSE2Fast,LZCNT,SSSE3,SSE4.2,AVX,FMA3,BMI2,AVX2"


def x264_params(*settings: str) -> str:
    """libx264's `x264-params` string: `settings` ("key=value"), one thread, and on a CPU with
    AVX-512 the AVX2 code paths."""
    params = [*settings, ONE_THREAD]
    if _has_avx512():
        params.append(f"asm={_UP_TO_AVX2}")
    return ":".join(params)


@functools.cache
def _has_avx512() -> bool:
    """AVX-512 as libx264 would detect it (foundation and byte/word instructions), read from Linux's
    /proc/cpuinfo; False where that cannot be read (macOS, Windows, ARM), which leaves libx264's
    own detection in charge."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return {"avx512f", "avx512bw"} <= flags
    return False
