"""The `convert` step: paired recordings -> one zarr dataset on the camera clock.

Each recording becomes a cache entry (`convert_cache`), converted in a process of its own
(`convert_workers`) or by Slurm array tasks (`cluster.convert_jobs`); one recording that fails is
excluded with its reason. The episodes must share one frequency (or be resampled); the store is
then assembled from the cache (`store_writer`): byte-identical whatever the number of workers.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from policypipe.dataset.convert_cache import RecordingInput, current_cache
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.convert_workers import Runner, convert_all_or_disk_full, convert_recordings
from policypipe.dataset.episode import DAMAGE_WARNING
from policypipe.dataset.errors import DatasetError
from policypipe.dataset.store_writer import assemble_store

log = logging.getLogger(__name__)


def recordings_from_manifest(manifest: dict[str, Any], export_root: Path) -> list[RecordingInput]:
    inputs = []
    for rec in manifest["recordings"]:
        frames = rec.get("status", {}).get("frames")
        source = rec.get("source")  # an HDF5 demo: its file is the `hdf5` entry
        read = rec["files"]["hdf5" if source else "vio"]
        inputs.append(
            RecordingInput(
                stem=rec["stem"],
                folder=rec["folder"],
                vio_path=export_root / read["path"],
                vio_sha256=read["sha256"],
                truncated=bool(rec.get("truncated", False)),
                expected_frames=frames if isinstance(frames, int) and not isinstance(frames, bool) else None,
                # Its file's export-relative path with it: the dataset's lineage names both.
                source=source and {**source, "path": read["path"]},
            )
        )
    return inputs


# ---------------------------------------------------------------- cache -> store


@dataclass(frozen=True)
class ConversionResult:
    episodes: list[dict[str, Any]]
    excluded: list[dict[str, Any]]
    frequency_hz: float
    frames: int
    store_bytes: int
    store_files: int

    def metrics(self) -> dict[str, Any]:
        cameras = self._camera_metrics()
        return self._metrics() | ({"cameras": cameras} if cameras else {})

    def _camera_metrics(self) -> dict[str, Any]:
        """Per camera beyond camera 0 (none in a single-camera dataset): over the episodes, where it
        was absent, the rows it is missing at, its frames' largest offset from their rows."""
        summary: dict[str, Any] = {}
        for ep in self.episodes:
            for name, camera in ep.get("cameras", {}).items():
                total = summary.setdefault(
                    name, {"episodes_absent": 0, "rows_missing": 0, "gaps": 0, "offset_ms_max": None}
                )
                total["episodes_absent"] += camera["topic"] is None
                total["rows_missing"] += camera["rows_missing"]
                total["gaps"] += camera["gaps"]
                largest = camera["offset_ms"]["max_abs"]
                if largest is not None:
                    total["offset_ms_max"] = max(largest, total["offset_ms_max"] or 0.0)
        return summary

    def _metrics(self) -> dict[str, Any]:
        dropped: Counter[str] = Counter()
        lost: Counter[str] = Counter()
        for ep in self.episodes:
            dropped.update(ep["dropped"])
            dropped["camera_gap"] += ep["camera_gaps"]
            lost.update(ep["lost_messages"])
        return {
            "episodes": len(self.episodes),
            "frames": self.frames,
            "frequency_hz": self.frequency_hz,
            "frames_dropped_by_reason": dict(sorted(dropped.items())),
            # Messages in damaged chunks or unparseable, per stream: the file lost them, not convert.
            "messages_lost_by_stream": dict(sorted(lost.items())),
            "episodes_from_damaged_files": sum(
                1
                for ep in self.episodes
                if ep["lost_messages"]
                or ep["read_stopped"]
                # A chunk lost without a message index after it: damage, but no count of messages.
                or any(w.startswith(DAMAGE_WARNING) for w in ep["warnings"])
            ),
            "episodes_read_only_up_to_damage": sum(1 for ep in self.episodes if ep["read_stopped"]),
            "recordings_excluded": len(self.excluded),
            "recordings_excluded_by_reason": dict(
                sorted(Counter(e["excluded"] for e in self.excluded).items())
            ),
            # With convert.resample_hz: the farthest any chosen frame is from its grid time.
            "resample_offset_ms_max": max(
                (ep["resample_offset_ms"]["max"] for ep in self.episodes if ep["resample_offset_ms"]),
                default=None,
            ),
            "bytes_per_frame": round(self.store_bytes / max(self.frames, 1), 1),
            "store_files": self.store_files,
        }

    def report(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "excluded": self.excluded}


def convert_dataset(
    manifest_path: Path,
    export_root: Path,
    out_path: Path,
    cache_dir: Path,
    config: ConvertConfig,
    progress: Callable[[dict], None] | None = None,
    runner: Runner = convert_recordings,
) -> ConversionResult:
    """The store at `out_path` from the manifest's recordings, through the cache; `runner`
    converts what the cache lacks (the store is assembled here either way, so its bytes do not
    depend on where the conversion ran)."""
    manifest = json.loads(Path(manifest_path).read_text())
    inputs = recordings_from_manifest(manifest, Path(export_root))
    if not inputs:
        raise DatasetError(
            f"{manifest_path} lists no recordings: nothing to convert (see the pair stage's report)"
        )
    cache_dir = current_cache(Path(cache_dir))

    records = convert_all_or_disk_full(inputs, config, cache_dir, progress, runner)
    episodes = [r for r in records if "excluded" not in r]
    excluded = [r for r in records if "excluded" in r]
    if not episodes:
        reasons = "; ".join(f"{r['stem']}: {r['detail']}" for r in excluded[:5])
        raise DatasetError(f"no recording could be converted ({reasons})")

    frequency = _dataset_frequency(episodes, config)
    assemble_store(out_path, episodes, cache_dir, config, frequency)
    files = [p for p in out_path.rglob("*") if p.is_file()]
    return ConversionResult(
        episodes=episodes,
        excluded=excluded,
        frequency_hz=frequency,
        frames=sum(ep["frames"] for ep in episodes),
        store_bytes=sum(p.stat().st_size for p in files),
        store_files=len(files),
    )


def _dataset_frequency(episodes: list[dict[str, Any]], config: ConvertConfig) -> float:
    if config.resample_hz is not None:
        return float(config.resample_hz)
    frequency = round(median(ep["frequency_hz"] for ep in episodes), 6)
    off = [
        f"{ep['stem']} ({ep['frequency_hz']:.2f} Hz)"
        for ep in episodes
        if abs(ep["frequency_hz"] - frequency) > config.frequency_tolerance * frequency
    ]
    if off:
        raise DatasetError(
            f"episodes recorded at another rate than the dataset's {frequency:.2f} Hz "
            f"(tolerance {config.frequency_tolerance:.0%}): {', '.join(off)}. "
            "Set convert.resample_hz to resample every episode onto one grid, or remove them from the export."
        )
    return frequency
