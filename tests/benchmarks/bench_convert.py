"""Conversion benchmark (`make bench`): ratios against baselines measured in the same run.

- end-to-end conversion frames/s with one worker / frames/s of a bare decode+resize loop over
  the same frames (target >= 0.7);
- speed-up with two workers over one (target >= 1.7 on 2 cores);
- where the time goes: the CPU seconds of each step a conversion takes (reading the MCAP,
  decoding, the episode's interpolation, JPEG encoding, the cache entry, the store, the worker
  process), each timed alone over the same recordings, and the CPU-time ratio of the one-worker
  conversion (robust to a machine loaded by other work, unlike the wall-clock figures);
- bytes per frame, files per 1,000 frames, one random frame read from the store;
- the image codec comparison behind the choice of JPEG (size and decode time per frame;
  `--codecs-to docs/dataset.md` measures it alone and writes it there);
- peak RSS of converting one recording at 320x240 vs 1920x1080 and 100 vs 1,000 frames, each
  in a fresh process, as ratios to 320x240 / 100 frames (bounded: frames are decoded one at a
  time, so input resolution and length add the compressed input and the small output only).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import cv2
import numpy as np
import zarr
from numcodecs import Blosc, Zstd

from policypipe.atomic import canonical_json, write_json_atomic
from policypipe.dataset import convert_cache, episode, layout
from policypipe.dataset.convert import ConversionResult, convert_dataset
from policypipe.dataset.convert_cache import current_cache, save_arrays, write_cache_file
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.episode import build_episode, decode_frames
from policypipe.dataset.image_codec import encode_jpeg
from policypipe.dataset.store_writer import assemble_store
from policypipe.lineage.code import module_code_sha256
from policypipe.processes import process_pool
from policypipe.recordings.layout import Role
from policypipe.recordings.pairing import PairConfig, PairingResult, pair_export
from policypipe.recordings.streams import read_streams
from policypipe.synthetic.export import SampleConfig, write_sample_export
from policypipe.synthetic.motion import plan_motion
from policypipe.synthetic.render import render_frame
from tests.benchmarks.docs_block import replace_block


def cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (a pool's workers are
    joined, so counted, when the pool is left)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bare_decode_resize(vio_paths: list[Path], config: ConvertConfig) -> tuple[int, float, float]:
    """The floor: decode and resize every frame, payloads already in memory; (frames, wall s, CPU s)."""
    payloads = [read_streams(p, config.topics) for p in vio_paths]
    cv2.setNumThreads(1)
    c0, t0 = cpu_s(), time.perf_counter()
    frames = 0
    for streams in payloads:
        frames += len(decode_frames(streams.cameras[0], config.image_size).dropped)
    return frames, time.perf_counter() - t0, cpu_s() - c0


def timed_convert(
    manifest: Path, export: Path, out: Path, config: ConvertConfig
) -> tuple[float, float, ConversionResult]:
    """(wall s, CPU s of this process and its workers, the result)."""
    c0, t0 = cpu_s(), time.perf_counter()
    result = convert_dataset(manifest, export, out, out.with_suffix(".cache"), config)
    return time.perf_counter() - t0, cpu_s() - c0, result


# ---------------------------------------------------------------- where the time goes

READ, DECODE, EPISODE, ENCODE, CACHE, STORE, POOL, IDENTITY = (
    "read the _vio.mcap (parse, chunk CRCs)",
    "decode+resize (the bare loop's work)",
    "episode besides decoding (interpolation)",
    "JPEG encode of the kept frames",
    "cache entry besides encoding (npz, record)",
    "store assembly from the cache",
    "worker process (fork, start, stop)",
    "converter identity (hash of its code)",
)


def encode_all(frames: np.ndarray, quality: int) -> list[bytes]:
    return [encode_jpeg(frame, quality) for frame in frames]


def cost_breakdown(
    vio_paths: list[Path], config: ConvertConfig, cache_dir: Path, converted: ConversionResult, tmp: Path
) -> dict[str, float]:
    """CPU seconds of each step of a one-worker conversion, each timed alone in this process over
    the same recordings, one recording in memory at a time. The store is assembled again from the
    one-worker run's cache, as that run did. The last two are paid once per conversion."""
    steps = dict.fromkeys((READ, DECODE, EPISODE, ENCODE, CACHE, STORE, POOL, IDENTITY), 0.0)

    def timed(step, fn, *args):
        t0 = time.process_time()
        out = fn(*args)
        steps[step] += time.process_time() - t0
        return out

    scratch = tmp / "breakdown"
    scratch.mkdir()
    for i, path in enumerate(vio_paths):
        streams = timed(READ, read_streams, path, config.topics)
        decoded = timed(DECODE, decode_frames, streams.cameras[0], config.image_size)
        # Decoded once: the episode's own work is timed without decoding again, and the cache
        # entry's without encoding again.
        with mock.patch.object(episode, "decode_frames", lambda *_, d=decoded: d):
            ep = timed(EPISODE, build_episode, streams, config)
        encoded = timed(ENCODE, encode_all, ep.rgb, config.jpeg_quality)
        again = iter(encoded)
        with mock.patch.object(convert_cache, "encode_jpeg", lambda *_, it=again: next(it)):
            timed(CACHE, save_arrays, scratch / f"{i}.npz", ep, config.jpeg_quality)
        record = canonical_json({"frames": len(ep.capture_ns), "warnings": ep.warnings})
        timed(CACHE, write_cache_file, scratch / f"{i}.json", record, len(ep.capture_ns))
    timed(
        STORE,
        assemble_store,
        scratch / "store.zarr",
        converted.episodes,
        current_cache(cache_dir),
        config,
        converted.frequency_hz,
    )
    c0 = cpu_s()
    with process_pool(1) as pool:
        pool.submit(int).result()
    steps[POOL] = cpu_s() - c0
    timed(IDENTITY, module_code_sha256.__wrapped__, "policypipe.dataset.convert")
    return steps


def random_frame_read_ms(store: Path, reads: int = 200) -> float:
    rgb = zarr.open_group(store, mode="r")[layout.RGB]
    rng = np.random.default_rng(0)
    times = []
    for i in rng.integers(0, rgb.shape[0], reads):
        t0 = time.perf_counter()
        rgb[int(i)]
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


_PEAK_KB = """
import resource
# This process's high-water mark is read from /proc (getrusage's RUSAGE_SELF would include the
# benchmark's own size, forked before exec), its workers' from getrusage (forked, not exec'd).
def _peak_kb():
    own = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""

PEAK_RSS_SCRIPT = (
    _PEAK_KB
    + """
import sys
from pathlib import Path
from policypipe.dataset.convert import ConversionResult, convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
convert_dataset(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), ConvertConfig(workers=1))
# Recordings are decoded in a worker process, the store is assembled here: the larger peak.
print(_peak_kb())
"""  # noqa: E501
)


def peak_rss_mb(manifest: dict, keep: int, export: Path, tmp: Path) -> float:
    """Peak RSS of a whole conversion (the stage's process or its worker) of the first `keep` recordings."""
    subset = tmp / f"manifest_{keep}.json"
    write_json_atomic(subset, manifest | {"recordings": manifest["recordings"][:keep]})
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            PEAK_RSS_SCRIPT,
            str(subset),
            str(export),
            str(tmp / f"rss_{keep}.zarr"),
            str(tmp / f"rss_{keep}.cache"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1]) / 1024


# ---------------------------------------------------------------- peak RSS of one recording

RECORDING_RSS_SCRIPT = (
    _PEAK_KB
    + """
import sys
from pathlib import Path
from policypipe.dataset.convert import ConversionResult, convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
if sys.argv[1] != "imports-only":
    convert_dataset(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), ConvertConfig(workers=1))
# This fresh process or its worker (which decodes), whichever peaked higher (RUSAGE_CHILDREN in
# the benchmark itself would be the largest of all runs so far).
print(_peak_kb())
"""  # noqa: E501
)


def write_one_recording(
    export: Path, stem: str, image_size: tuple[int, int], frames: int, distinct: int = 8
) -> None:
    """A `S_vio.mcap` of `frames` 30 Hz JPEG frames with pose and width, its raw `S.mcap` and
    status json. Rendering and encoding 1,000 1080p frames would take minutes on 2 cores:
    `distinct` rendered frames are encoded once and reused in turn (the decoder cannot tell)."""
    from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
    from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
    from mcap.writer import CompressionType, Writer
    from mcap_protobuf.schema import build_file_descriptor_set

    start_ns = 1_800_000_000_000_000_000
    plan = plan_motion(np.random.default_rng(0), start_ns, duration_s=frames / 30 + 0.5)
    camera_ns = start_ns + 100_000_000 + np.round(np.arange(frames) * 1e9 / 30).astype(np.int64)
    jpegs = [
        cv2.imencode(".jpg", render_frame(plan, int(t), image_size), [cv2.IMWRITE_JPEG_QUALITY, 80])[
            1
        ].tobytes()
        for t in camera_ns[np.linspace(0, frames - 1, distinct).astype(int)]
    ]
    pose_ns = np.arange(start_ns, plan.end_ns, 1_000_000_000 // 150, dtype=np.int64)
    width_ns = np.arange(start_ns, plan.end_ns, 1_000_000_000 // 45, dtype=np.int64)
    position, quat = plan.pose_at(pose_ns)
    width_m = plan.width_at(width_ns)

    def stamped(msg, t: int):
        msg.timestamp.FromNanoseconds(int(t))
        return msg

    messages = []  # (capture ns, channel, bytes); written in capture-time order
    for i, t in enumerate(camera_ns):
        msg = stamped(CompressedImage(frame_id="camera0", format="jpeg", data=jpegs[i % distinct]), t)
        messages.append((int(t), "image", msg.SerializeToString()))
    for t, p, q in zip(pose_ns, position, quat):
        msg = stamped(PoseInFrame(frame_id="world"), t)
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in p)
        o = msg.pose.orientation
        o.x, o.y, o.z, o.w = (float(v) for v in q)
        messages.append((int(t), "pose", msg.SerializeToString()))
    for t, w in zip(width_ns, width_m):
        messages.append((int(t), "width", json.dumps({"stamp_ns": int(t), "width_m": float(w)}).encode()))
    messages.sort(key=lambda m: m[0])

    def write(path: Path, keep: set[str]) -> None:
        with open(path, "wb") as f:
            writer = Writer(f, compression=CompressionType.NONE)  # JPEG does not compress
            writer.start()
            ids = {}
            for key, topic, message_type in (
                ("image", "/camera0/image", CompressedImage),
                ("pose", "/vio/pose", PoseInFrame),
            ):
                schema = writer.register_schema(
                    message_type.DESCRIPTOR.full_name,
                    "protobuf",
                    build_file_descriptor_set(message_type).SerializeToString(),
                )
                ids[key] = writer.register_channel(topic, "protobuf", schema)
            width_schema = writer.register_schema("GripperWidth", "jsonschema", b'{"type":"object"}')
            ids["width"] = writer.register_channel("/gripper/width", "json", width_schema)
            for t, key, data in messages:
                if key in keep:
                    writer.add_message(ids[key], log_time=t, publish_time=t, data=data)
            writer.finish()

    write(export / f"{stem}_vio.mcap", {"image", "pose", "width"})
    write(export / f"{stem}.mcap", {"pose"})  # the raw recording is hashed, never decoded
    status = {"source": f"{stem}.mcap", "output": f"{stem}_vio.mcap", "status": "success", "frames": frames}
    write_json_atomic(export / f"{stem}_vio.json", status)


def recording_peak_rss_mb(tmp: Path, image_size: tuple[int, int] | None, frames: int) -> float:
    """Peak RSS of a fresh process converting one recording, or of its worker; None: imports only."""
    if image_size is None:
        args = ["imports-only"]
    else:
        name = f"rss_{image_size[0]}x{image_size[1]}_{frames}"
        export = tmp / name / "export"
        export.mkdir(parents=True)
        write_one_recording(export, "rec", image_size, frames)
        manifest = tmp / name / "manifest.json"
        write_json_atomic(manifest, pair_export(export, PairConfig()).manifest())
        args = [str(manifest), str(export), str(tmp / name / "out.zarr"), str(tmp / name / "cache")]
    out = subprocess.run(
        [sys.executable, "-c", RECORDING_RSS_SCRIPT, *args], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1]) / 1024  # kB -> MB


def recording_rss_table(tmp: Path) -> None:
    cases = [((320, 240), 100), ((320, 240), 1000), ((1920, 1080), 100), ((1920, 1080), 1000)]
    imports = recording_peak_rss_mb(tmp, None, 0)
    rss = {case: recording_peak_rss_mb(tmp, *case) for case in cases}
    base = rss[cases[0]]
    full_frame_mb = 1920 * 1080 * 3 / 2**20
    print(f"peak RSS of converting one recording (fresh process each; imports alone {imports:.0f} MB):")
    for (w, h), frames in cases:
        mb = rss[((w, h), frames)]
        print(
            f"  {w:4d}x{h:<4d} {frames:5d} frames   {mb:7.0f} MB   ratio {mb / base:5.2f}   "
            f"above imports {mb - imports:6.0f} MB"
        )
    print(
        f"  (one 1920x1080 RGB frame is {full_frame_mb:.1f} MB; "
        f"1,000 of them held at once would be {1000 * full_frame_mb:.0f} MB)"
    )


def codec_table(frames: np.ndarray) -> list[tuple[str, float, float]]:
    def jpeg(q):
        def enc(f):
            return cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, q])[1]

        def dec(b):
            return cv2.cvtColor(cv2.imdecode(b, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

        return enc, dec

    candidates = {
        "JPEG q95 (chosen)": jpeg(95),
        "JPEG q90": jpeg(90),
        "PNG": (lambda f: cv2.imencode(".png", f)[1], lambda b: cv2.imdecode(b, cv2.IMREAD_UNCHANGED)),
        "zstd-3": (Zstd(level=3).encode, Zstd(level=3).decode),
        "blosc-zstd-5": (Blosc("zstd", 5, Blosc.NOSHUFFLE).encode, Blosc("zstd", 5, Blosc.NOSHUFFLE).decode),
        "blosc-lz4-5": (Blosc("lz4", 5, Blosc.NOSHUFFLE).encode, Blosc("lz4", 5, Blosc.NOSHUFFLE).decode),
    }
    rows = []
    for name, (encode, decode) in candidates.items():
        blobs = [np.frombuffer(bytes(encode(f)), np.uint8) for f in frames]
        t0 = time.perf_counter()
        for b in blobs:
            decode(b)
        rows.append(
            (name, float(np.mean([len(b) for b in blobs])), 1e6 * (time.perf_counter() - t0) / len(blobs))
        )
    return rows


LOSSLESS = ("PNG", "zstd-3", "blosc-zstd-5", "blosc-lz4-5")


def codec_docs(rows: list[tuple[str, float, float]], frames: int, image_size: tuple[int, int]) -> str:
    """The codec table and what it says, as docs/dataset.md shows them (`--codecs-to`)."""
    table = [
        f"Measured on {frames} of the sample's frames at {image_size[0]}x{image_size[1]}, "
        "on a 2-core machine:",
        "",
        "| codec | bytes/frame | decode µs/frame |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {size:,.0f} | {decode_us:,.0f} |" for name, size, decode_us in rows),
    ]
    sizes = {name: size for name, size, _ in rows}
    chosen_size, chosen_us = next((size, us) for name, size, us in rows if "chosen" in name)
    lossless = min(sizes[n] for n in LOSSLESS if n in sizes)
    table += [
        "",
        f"JPEG q95 (`convert.jpeg_quality`) is {lossless / chosen_size:.1f}x smaller "
        f"than the best lossless codec; decoding a frame costs {chosen_us / 1000:.2f} ms, which a "
        "DataLoader worker hides behind a training step.",
    ]
    return "\n".join(table)


def paired_sample(tmp: Path, recordings: int) -> tuple[Path, PairingResult, Path]:
    """A sample export of `recordings` (seed 1, no defects) in `tmp`, its pairing and manifest."""
    export = write_sample_export(tmp / "raw", SampleConfig(recordings=recordings, seed=1, defects=False)).root
    result = pair_export(export, PairConfig())
    manifest = tmp / "manifest.json"
    write_json_atomic(manifest, result.manifest())
    return export, result, manifest


def stored_frames(store: Path) -> np.ndarray:
    """The frames the codec table measures: the first 500 stored."""
    return zarr.open_group(store, mode="r")[layout.RGB][:500]


def codecs_into_docs(tmp: Path, docs: Path) -> None:
    """Measures the codec table alone, on two sample recordings' stored frames, into `docs`."""
    export, _, manifest = paired_sample(tmp, recordings=2)
    config = ConvertConfig()
    timed_convert(manifest, export, tmp / "one.zarr", replace(config, workers=1))
    sample = stored_frames(tmp / "one.zarr")
    text = codec_docs(codec_table(sample), len(sample), config.image_size)
    replace_block(docs, "codecs", text)
    print(text)
    print(f"written into {docs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recordings", type=int, default=24)
    parser.add_argument("--only-rss", action="store_true", help="only the peak-RSS table of one recording")
    parser.add_argument(
        "--codecs-to",
        type=Path,
        metavar="DOCS",
        help="only the codec table, written into DOCS (docs/dataset.md)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="policypipe-bench-") as tmp:
        tmp = Path(tmp)
        if args.codecs_to:
            codecs_into_docs(tmp, args.codecs_to)
            return
        if args.only_rss:
            recording_rss_table(tmp)
            return
        export, result, manifest = paired_sample(tmp, args.recordings)
        config = ConvertConfig()
        vio = [export / r.files[Role.VIO].path for r in result.recordings]

        frames, bare_s, bare_cpu = bare_decode_resize(vio, config)
        one_s, one_cpu, converted = timed_convert(
            manifest, export, tmp / "one.zarr", replace(config, workers=1)
        )
        two_s, _, _ = timed_convert(manifest, export, tmp / "two.zarr", replace(config, workers=2))
        bare_fps, one_fps, two_fps = frames / bare_s, frames / one_s, frames / two_s
        m = converted.metrics()
        print(
            f"conversion of {args.recordings} sample recordings, "
            f"{frames} camera frames at 320x240 -> {config.image_size}"
        )
        print(f"  bare decode+resize loop     {bare_fps:8.0f} frames/s   (baseline)")
        print(
            f"  convert, 1 worker           {one_fps:8.0f} frames/s   "
            f"ratio to baseline {one_fps / bare_fps:.2f} (target >= 0.7)"
        )
        print(
            f"  convert, 2 workers          {two_fps:8.0f} frames/s   "
            f"speed-up over 1 worker {two_fps / one_fps:.2f} (target >= 1.7)"
        )
        print(f"  bytes per frame             {m['bytes_per_frame']:8.0f}")
        print(f"  files per 1,000 frames      {1000 * m['store_files'] / m['frames']:8.1f}")
        print(
            f"  one random frame read       {random_frame_read_ms(tmp / 'one.zarr'):8.2f} ms (median of 200)"
        )
        steps = cost_breakdown(vio, config, tmp / "one.cache", converted, tmp)
        print(
            f"where the time goes: CPU s of each step over the same {frames} frames, timed alone "
            f"(% of the bare loop's {bare_cpu:.2f} CPU s):"
        )
        for step, seconds in steps.items():
            print(f"  {step:44s} {seconds:6.3f} s {100 * seconds / bare_cpu:5.1f} %")
        floor = sum(steps.values())
        print(
            f"  sum {floor:.2f} s: at best ratio {steps[DECODE] / floor:.2f}; measured: convert, 1 worker "
            f"{one_cpu:.2f} CPU s (this process and its worker), ratio {bare_cpu / one_cpu:.2f}"
        )
        few, many = 4, args.recordings
        rss_few, rss_many = (peak_rss_mb(result.manifest(), k, export, tmp) for k in (few, many))
        print(
            f"  peak RSS, {few} vs {many} recordings  {rss_few:6.0f} MB vs {rss_many:.0f} MB "
            f"(ratio {rss_many / rss_few:.2f}; bounded: ~1)"
        )
        sample = stored_frames(tmp / "one.zarr")
        print(f"image codecs on {len(sample)} stored frames at {config.image_size}:")
        for name, size, decode_us in codec_table(sample):
            print(f"  {name:20s} {size:8.0f} B/frame   decode {decode_us:7.1f} us/frame")
        recording_rss_table(tmp)


if __name__ == "__main__":
    main()
