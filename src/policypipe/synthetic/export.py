"""The built-in demo data: an export folder exactly as the studio writes it
(shared/recording-format.md), with synthetic pick-and-place demonstrations inside.

`write_sample_export` writes good recordings spread over session folders, plus (optionally)
one extra stem per kind of defect a real export has. Everything is a pure function of the
config: the same config writes byte-identical files (no wall clock, fixed encoder threads,
per-recording seeds independent of scheduling).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from policypipe.processes import process_pool
from policypipe.synthetic.ground_truth import RecordingDraws
from policypipe.synthetic.recording import (
    STUDIO_VERSION,
    SimulatedRecording,
    StreamTiming,
    random_timing,
    simulate_recording,
    write_simulated_raw,
    write_simulated_vio,
)
from policypipe.synthetic.rig import (
    SCENE_CAMERA_HZ,
    SCENE_CAMERA_JITTER_S,
    RigRecording,
    plan_rig,
    simulate_rig_recording,
)

log = logging.getLogger(__name__)

RECORDINGS_PER_SESSION = 8

# Defect name -> what it is. The names are a contract with the pair stage's tests.
DEFECT_NAMES = (
    "status_failed",  # complete triplet, json "status": "failed" with an "error" text
    "missing_json",  # S.mcap and S_vio.mcap, no S_vio.json
    "empty_vio",  # S_vio.mcap is 0 bytes
    "retry_leftover",  # "S_vio (1).mcap" next to a good recording
    "partial_leftover",  # "S_vio.mcap.partial" next to a good recording
    "other_task",  # valid triplet of another task
    "invalid_json",  # S_vio.json is truncated text
    "source_outside",  # json "source" is "../x.mcap"
    "duplicate_stem",  # the same stem as complete valid triplets in two session folders
    "truncated_vio",  # S_vio.mcap cut mid-file (no footer), json still "success"
    "not_mcap",  # S_vio.mcap is an HTML error page
)
_LEFTOVER_DEFECTS = ("retry_leftover", "partial_leftover")  # extra files, not extra stems

_TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleConfig:
    """What `write_sample_export` writes. The defaults are the demo export."""

    recordings: int = 96  # good recordings; defects come on top (96: docs/sample-data.md)
    seed: int = 0
    # "image": CompressedImage JPEG on /camera0/image; "video": CompressedVideo H.264 on /camera0/video
    camera: str = "image"
    defects: bool = True
    task: str = "pick_place"
    image_width: int = 320
    image_height: int = 240
    # The fraction of recordings that are recovery demonstrations: the hand strays off the plain
    # path and corrects back (`motion.plan_motion`; docs/rollout.md, "Recovery demonstrations").
    # Which ones is drawn per recording from the seed; 0 writes exactly the plain export.
    recovery: float = 0.0
    # The fraction of recordings made by a person's hand (`motion.PersonsHand`; docs/sample-data.md):
    # grasps off the block's centre along the fingers, and half of them arrive above the block turned
    # or off and correct before descending. Drawn per recording from the seed; 0: the plain export.
    hand: float = 0.0
    # A rig (recording format 2, `rig`): this many grippers side by side, each with its wrist camera,
    # and with `scene_camera` a fixed camera over the table. The second recording of a rig export
    # lacks the scene camera (a camera unplugged for one take). 1 and False: the demo's format 1.
    grippers: int = 1
    scene_camera: bool = False

    @property
    def rig(self) -> bool:
        return self.grippers > 1 or self.scene_camera

    def __post_init__(self) -> None:
        if not isinstance(self.grippers, int) or not 1 <= self.grippers <= 4:
            raise ValueError(f"grippers={self.grippers!r}: use 1 to 4 grippers")
        if self.rig and (self.camera != "image" or self.recovery or self.hand):
            raise ValueError(
                "a rig export (grippers > 1 or scene_camera) writes JPEG images and plain demonstrations: "
                "leave camera at 'image', recovery and hand at 0"
            )
        for name, fraction in (("recovery", self.recovery), ("hand", self.hand)):
            if not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
                raise ValueError(f"{name}={fraction!r}: use a fraction of the recordings from 0 to 1")
        if not isinstance(self.recordings, int) or not 1 <= self.recordings <= 10_000:
            raise ValueError(
                f"recordings={self.recordings!r}: set recordings to a whole number from 1 to 10000"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}: set seed to a non-negative whole number")
        if self.camera not in ("image", "video"):
            raise ValueError(
                f"camera={self.camera!r}: set camera to 'image' (JPEG frames) or 'video' (H.264)"
            )
        if not isinstance(self.task, str) or not _TASK_RE.match(self.task):
            raise ValueError(f"task={self.task!r}: use a non-empty name of letters, digits, '_', '-' or '.'")
        for name, value, low in (
            ("image_width", self.image_width, 64),
            ("image_height", self.image_height, 48),
        ):
            if not isinstance(value, int) or not low <= value <= 4096 or value % 2:
                raise ValueError(
                    f"{name}={value!r}: use an even number of pixels from {low} to 4096 "
                    "(even: H.264 stores colour at half resolution)"
                )


@dataclass(frozen=True)
class SampleExport:
    """What `write_sample_export` wrote."""

    root: Path
    good_stems: tuple[str, ...]  # complete, valid recordings the pipeline must accept
    defects: dict[str, tuple[str, ...]]  # defect name -> export-relative POSIX paths of its files
    files: int
    bytes: int


# --- the export ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    index: int  # seeds derive from (config.seed, index): independent of scheduling
    stem: str
    folder: str
    defect: str | None
    config: SampleConfig = field(repr=False)


@dataclass(frozen=True)
class _JobResult:
    index: int
    files: tuple[str, ...]  # export-relative POSIX paths written
    frames: int


def _iso(t_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_ns // 1_000_000_000))


def studio_status(
    stem: str, task: str, frames: int, end_ns: int, rng: np.random.Generator, **changes
) -> dict:
    started = end_ns + int(rng.uniform(20, 90) * 1e9)
    finished = started + int(rng.uniform(40, 120) * 1e9)
    status = {
        "source": f"{stem}.mcap",
        "output": f"{stem}_vio.mcap",
        "status": "success",
        "error": None,
        "task": task,
        "frames": frames,
        "started_at": _iso(started),
        "finished_at": _iso(finished),
        "studio_version": STUDIO_VERSION,
    }
    status.update(changes)
    return status


def _format_variation(index: int) -> dict:
    """Good recordings vary the way real exports do: mostly zstd chunks with a summary,
    some lz4, some uncompressed, a few without summary or without chunks."""
    return {
        "compression": ("zstd", "zstd", "lz4", "zstd", "none", "zstd", "lz4", "zstd")[index % 8],
        "chunked": index % 11 != 9,
        "summary": index % 7 != 5,
    }


_HTML_ERROR_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>502 Bad Gateway</h1><p>The storage proxy did not answer in time.</p></body></html>\n"
)


def _run_job(tmp_root: str, job: _Job) -> _JobResult:
    """Writes every file of one stem (the worker of `write_sample_export`)."""
    import cv2

    cv2.setNumThreads(1)  # processes give the parallelism (also when called without a pool)
    cfg = job.config
    draws = RecordingDraws.of(cfg.seed, job.index)
    image_size = (cfg.image_width, cfg.image_height)
    rec: SimulatedRecording | RigRecording
    if cfg.rig:
        rec = _simulate_rig(
            cfg, job.index, draws.start_ns, draws.plan, np.random.default_rng(draws.timing), draws.sim
        )
        duration_s = (rec.rig.end_ns - rec.rig.start_ns) / 1e9
    else:
        plan = draws.single_plan(cfg.recovery, cfg.hand)
        timing = random_timing(np.random.default_rng(draws.timing))
        rec = simulate_recording(
            plan, timing, np.random.default_rng(draws.sim), camera=cfg.camera, image_size=image_size
        )
        duration_s = plan.duration_s
    status_rng = np.random.default_rng(draws.status)

    folder = Path(tmp_root) / job.folder
    folder.mkdir(parents=True, exist_ok=True)
    raw, vio, status_path = (folder / f"{job.stem}{suffix}" for suffix in (".mcap", "_vio.mcap", "_vio.json"))
    write_simulated_raw(raw, rec)
    write_simulated_vio(vio, rec, **(_format_variation(job.index) if job.defect is None else {}))
    status = studio_status(job.stem, cfg.task, rec.truth.frames, rec.truth.last_frame_ns, status_rng)

    defect = job.defect
    if defect == "status_failed":
        lost_s = float(status_rng.uniform(0.3, 0.8)) * duration_s
        status.update(status="failed", error=f"VIO lost tracking at {lost_s:.1f} s")
    elif defect == "empty_vio":
        vio.write_bytes(b"")
    elif defect == "other_task":
        status["task"] = "cup_arrangement" if cfg.task != "cup_arrangement" else "towel_folding"
    elif defect == "source_outside":
        status["source"] = "../x.mcap"
    elif defect == "truncated_vio":
        data = vio.read_bytes()
        vio.write_bytes(data[: int(len(data) * 0.55)])  # mid-chunk: no footer, no summary
    elif defect == "not_mcap":
        vio.write_bytes(_HTML_ERROR_PAGE)

    files = [raw, vio]
    if defect == "invalid_json":
        text = json.dumps(status, indent=2)
        status_path.write_text(text[: len(text) // 2], encoding="utf-8")  # a copy that stopped half-way
        files.append(status_path)
    elif defect != "missing_json":
        status_path.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
        files.append(status_path)
    rel = tuple(sorted(p.relative_to(tmp_root).as_posix() for p in files))
    log.debug("wrote %s (%s): %d frames", job.stem, defect or "good", rec.truth.frames)
    return _JobResult(index=job.index, files=rel, frames=rec.truth.frames)


# The rig export's recording without its scene camera.
RIG_RECORDING_WITHOUT_SCENE_CAMERA = 1


def _simulate_rig(
    cfg: SampleConfig,
    index: int,
    start_ns: int,
    plan_rng: np.random.Generator,
    timing_rng: np.random.Generator,
    sim_seq: np.random.SeedSequence,
) -> RigRecording:
    rig = plan_rig(plan_rng, start_ns, cfg.grippers)
    timings = tuple(random_timing(timing_rng) for _ in range(cfg.grippers))
    scene_timing = None
    if cfg.scene_camera:
        scene_timing = StreamTiming(
            camera_hz=SCENE_CAMERA_HZ,
            camera_jitter_s=SCENE_CAMERA_JITTER_S,
            camera_drop_fraction=float(timing_rng.uniform(0.02, 0.05)),
            camera_start_s=float(timing_rng.uniform(0.0, 0.3)),
            camera_stop_s=float(timing_rng.uniform(0.0, 0.3)),
        )
    absent = frozenset(
        {cfg.grippers} if cfg.scene_camera and index == RIG_RECORDING_WITHOUT_SCENE_CAMERA else ()
    )
    return simulate_rig_recording(
        rig,
        timings,
        scene_timing,
        np.random.default_rng(sim_seq),
        image_size=(cfg.image_width, cfg.image_height),
        absent_cameras=absent,
    )


def _plan_jobs(config: SampleConfig) -> tuple[list[_Job], dict[str, int]]:
    """The stems to write, and for each leftover defect the index of the good job it sits by."""
    n_good = config.recordings
    sessions = max(math.ceil(n_good / RECORDINGS_PER_SESSION), 2 if config.defects else 1)

    def folder(session: int) -> str:
        return f"session_{session + 1:02d}"

    jobs = [
        _Job(
            index=i,
            stem=f"rec_{i + 1:04d}",
            folder=folder(i // RECORDINGS_PER_SESSION),
            defect=None,
            config=config,
        )
        for i in range(n_good)
    ]
    leftovers: dict[str, int] = {}
    if not config.defects:
        return jobs, leftovers
    index = n_good
    for j, name in enumerate(DEFECT_NAMES):
        if name in _LEFTOVER_DEFECTS:
            continue
        stem = f"rec_{index + 1:04d}"
        jobs.append(_Job(index=index, stem=stem, folder=folder(j % sessions), defect=name, config=config))
        index += 1
        if name == "duplicate_stem":  # same stem, another session, another recording
            jobs.append(
                _Job(index=index, stem=stem, folder=folder((j + 1) % sessions), defect=name, config=config)
            )
            index += 1
    leftovers["retry_leftover"] = n_good // 3
    leftovers["partial_leftover"] = (2 * n_good) // 3
    return jobs, leftovers


def _write_leftovers(
    tmp_root: Path, jobs: list[_Job], leftovers: dict[str, int]
) -> dict[str, tuple[str, ...]]:
    """Leftovers of earlier attempts next to good recordings: a complete duplicate download
    and a copy that stopped at 40%."""
    found: dict[str, tuple[str, ...]] = {}
    for name, index in leftovers.items():
        job = jobs[index]
        vio = tmp_root / job.folder / f"{job.stem}_vio.mcap"
        data = vio.read_bytes()
        if name == "retry_leftover":
            target = vio.with_name(f"{job.stem}_vio (1).mcap")
            target.write_bytes(data)
        else:
            target = vio.with_name(f"{job.stem}_vio.mcap.partial")
            target.write_bytes(data[: int(len(data) * 0.4)])
        found[name] = (target.relative_to(tmp_root).as_posix(),)
    return found


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise FileExistsError(f"{out_dir} exists and is not a folder: choose another output path")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty: choose a new output folder or remove this one first")


def write_sample_export(out_dir: Path, config: SampleConfig, *, workers: int | None = None) -> SampleExport:
    """Writes a sample export folder at `out_dir`, which must not exist or be empty.

    Files are written into a hidden sibling folder that is renamed to `out_dir` when
    complete: a killed run leaves no folder that looks like an export. `workers`
    (default: one per CPU core, at most one per recording) changes speed, never bytes.
    """
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    jobs, leftovers = _plan_jobs(config)
    if workers is None:
        workers = os.cpu_count() or 1
    workers = max(1, min(workers, len(jobs)))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_root = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    log.info(
        "writing %d recordings (%d with defects) to %s with %d workers",
        len(jobs),
        len(jobs) - config.recordings,
        out_dir,
        workers,
    )
    try:
        if workers == 1:
            results = [_run_job(str(tmp_root), job) for job in jobs]
        else:
            with process_pool(workers) as pool:
                results = list(pool.map(_run_job, [str(tmp_root)] * len(jobs), jobs))
        defects: dict[str, list[str]] = {}
        for job, result in zip(jobs, results):
            if job.defect is not None:
                defects.setdefault(job.defect, []).extend(result.files)
        if config.defects:
            for name, files in _write_leftovers(tmp_root, jobs, leftovers).items():
                defects[name] = list(files)
        all_files = sorted(p for p in tmp_root.rglob("*") if p.is_file())
        total_bytes = sum(p.stat().st_size for p in all_files)
        os.chmod(tmp_root, 0o755)  # mkdtemp makes it private; an export folder is not
        _check_out_dir(out_dir)  # nobody wrote there meanwhile
        if out_dir.is_dir():
            out_dir.rmdir()
        os.replace(tmp_root, out_dir)
    except BaseException:
        shutil.rmtree(tmp_root, ignore_errors=True)
        raise
    export = SampleExport(
        root=out_dir,
        good_stems=tuple(job.stem for job in jobs if job.defect is None),
        defects={name: tuple(sorted(defects[name])) for name in DEFECT_NAMES if name in defects},
        files=len(all_files),
        bytes=total_bytes,
    )
    log.info("sample export %s: %d files, %.1f MB", out_dir, export.files, export.bytes / 1e6)
    return export
