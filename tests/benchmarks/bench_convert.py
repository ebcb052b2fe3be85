"""Conversion benchmark (`make bench`): ratios against baselines measured in the same run.

- end-to-end conversion frames/s with one worker / frames/s of a bare decode+resize loop over
  the same frames (target >= 0.7);
- speed-up with two workers over one (target >= 1.7 on 2 cores);
- bytes per frame, files per 1,000 frames, one random frame read from the store;
- the image codec comparison behind the choice of JPEG (size and decode time per frame).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import zarr
from numcodecs import Blosc, Zstd

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.convert import convert_dataset
from policypipe.recordings.episode import ConvertConfig, decode_frames
from policypipe.recordings.layout import Role
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.recordings.sample import SampleConfig, write_sample_export
from policypipe.recordings.streams import read_streams


def bare_decode_resize(vio_paths: list[Path], config: ConvertConfig) -> tuple[int, float]:
    """The floor: decode and resize every frame, payloads already in memory."""
    payloads = [read_streams(p, config.topics) for p in vio_paths]
    cv2.setNumThreads(1)
    t0 = time.perf_counter()
    frames = 0
    for streams in payloads:
        frames += len(decode_frames(streams, config.image_size)[1])
    return frames, time.perf_counter() - t0


def timed_convert(manifest: Path, export: Path, out: Path, config: ConvertConfig) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = convert_dataset(manifest, export, out, out.with_suffix(".cache"), config)
    return time.perf_counter() - t0, result


def random_frame_read_ms(store: Path, reads: int = 200) -> float:
    rgb = zarr.open_group(store, mode="r")[layout.RGB]
    rng = np.random.default_rng(0)
    times = []
    for i in rng.integers(0, rgb.shape[0], reads):
        t0 = time.perf_counter()
        rgb[int(i)]
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


PEAK_RSS_SCRIPT = """
import resource, sys
from pathlib import Path
from policypipe.dataset.convert import convert_dataset
from policypipe.recordings.episode import ConvertConfig
convert_dataset(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), ConvertConfig(workers=1))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mb(manifest: dict, keep: int, export: Path, tmp: Path) -> float:
    """Peak RSS of a whole conversion (one process) of the first `keep` recordings."""
    subset = tmp / f"manifest_{keep}.json"
    write_json_atomic(subset, manifest | {"recordings": manifest["recordings"][:keep]})
    out = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_SCRIPT, str(subset), str(export), str(tmp / f"rss_{keep}.zarr"), str(tmp / f"rss_{keep}.cache")],
        capture_output=True, text=True, check=True,
    )
    return int(out.stdout.split()[-1]) / 1024


def codec_table(frames: np.ndarray) -> list[tuple[str, float, float]]:
    def jpeg(q):
        enc = lambda f: cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, q])[1]  # noqa: E731
        dec = lambda b: cv2.cvtColor(cv2.imdecode(b, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)  # noqa: E731
        return enc, dec

    candidates = {
        "jpeg q90 (lossy)": jpeg(90),
        "jpeg q95 (lossy, chosen)": jpeg(95),
        "png (lossless)": (lambda f: cv2.imencode(".png", f)[1], lambda b: cv2.imdecode(b, cv2.IMREAD_UNCHANGED)),
        "zstd-3 (lossless)": (Zstd(level=3).encode, Zstd(level=3).decode),
        "blosc-zstd-5 (lossless)": (Blosc("zstd", 5, Blosc.NOSHUFFLE).encode, Blosc("zstd", 5, Blosc.NOSHUFFLE).decode),
        "blosc-lz4-5 (lossless)": (Blosc("lz4", 5, Blosc.NOSHUFFLE).encode, Blosc("lz4", 5, Blosc.NOSHUFFLE).decode),
    }
    rows = []
    for name, (encode, decode) in candidates.items():
        blobs = [np.frombuffer(bytes(encode(f)), np.uint8) for f in frames]
        t0 = time.perf_counter()
        for b in blobs:
            decode(b)
        rows.append((name, float(np.mean([len(b) for b in blobs])), 1e6 * (time.perf_counter() - t0) / len(blobs)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recordings", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        tmp = Path(tmp)
        export = write_sample_export(tmp / "raw", SampleConfig(recordings=args.recordings, seed=1, defects=False)).root
        result = pair_export(export, PairConfig())
        manifest = tmp / "manifest.json"
        write_json_atomic(manifest, result.manifest())
        config = ConvertConfig()
        vio = [export / r.files[Role.VIO].path for r in result.recordings]

        frames, bare_s = bare_decode_resize(vio, config)
        one_s, converted = timed_convert(manifest, export, tmp / "one.zarr", replace(config, workers=1))
        two_s, _ = timed_convert(manifest, export, tmp / "two.zarr", replace(config, workers=2))
        bare_fps, one_fps, two_fps = frames / bare_s, frames / one_s, frames / two_s
        m = converted.metrics()
        print(f"conversion of {args.recordings} sample recordings, {frames} camera frames at 320x240 -> {config.image_size}")
        print(f"  bare decode+resize loop     {bare_fps:8.0f} frames/s   (baseline)")
        print(f"  convert, 1 worker           {one_fps:8.0f} frames/s   ratio to baseline {one_fps / bare_fps:.2f} (target >= 0.7)")
        print(f"  convert, 2 workers          {two_fps:8.0f} frames/s   speed-up over 1 worker {two_fps / one_fps:.2f} (target >= 1.7)")
        print(f"  bytes per frame             {m['bytes_per_frame']:8.0f}")
        print(f"  files per 1,000 frames      {1000 * m['store_files'] / m['frames']:8.1f}")
        print(f"  one random frame read       {random_frame_read_ms(tmp / 'one.zarr'):8.2f} ms (median of 200)")
        few, many = 4, args.recordings
        rss_few, rss_many = (peak_rss_mb(result.manifest(), k, export, tmp) for k in (few, many))
        print(f"  peak RSS, {few} vs {many} recordings  {rss_few:6.0f} MB vs {rss_many:.0f} MB (ratio {rss_many / rss_few:.2f}; bounded: ~1)")
        sample = zarr.open_group(tmp / "one.zarr", mode="r")[layout.RGB][:500]
        print(f"image codecs on {len(sample)} stored frames at {config.image_size}:")
        for name, size, decode_us in codec_table(sample):
            print(f"  {name:26s} {size:8.0f} B/frame   decode {decode_us:7.1f} us/frame")


if __name__ == "__main__":
    main()
