"""Stage `convert`: paired recordings -> data/dataset.zarr on the camera clock."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from common import fail, load_config, setup_logging

from policypipe.atomic import write_json_atomic
from policypipe.cluster.submit import SlurmError
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_cache import converter_identity
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.errors import DatasetError
from policypipe.dataset.fingerprint import fingerprint
from policypipe.lineage.provenance import StageRun
from policypipe.progress import Progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument(
        "--export", type=Path, required=True, help="export folder the manifest's paths are relative to"
    )
    parser.add_argument("--out", type=Path, required=True, help="the zarr store to write")
    parser.add_argument(
        "--cache", type=Path, required=True, help="per-recording conversion cache (not a DVC output)"
    )
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True, help="per-episode report")
    parser.add_argument("--provenance", type=Path, required=True)
    args = parser.parse_args()
    setup_logging()
    config = load_config("convert", ConvertConfig)

    try:
        recordings = len(json.loads(args.manifest.read_text())["recordings"])
    except (OSError, ValueError, KeyError) as exc:
        fail(f"cannot read the manifest {args.manifest}: {exc}; run the pair stage first (dvc repro pair)")

    started = time.monotonic()
    with StageRun("convert", params=asdict(config)) as run:
        with Progress(recordings, desc="convert", unit="rec") as bar:
            frames = 0

            def progress(record: dict) -> None:
                nonlocal frames
                frames += record.get("frames", 0)
                bar.update(1, frames_per_s=f"{frames / max(time.monotonic() - started, 1e-9):.0f}")

            runner = None
            if config.executor == "slurm":
                from policypipe.cluster.convert_jobs import JOBS_FOLDER, SlurmConversion

                runner = SlurmConversion(args.cache / JOBS_FOLDER)
            try:
                result = convert_dataset(
                    args.manifest,
                    args.export,
                    args.out,
                    args.cache,
                    config,
                    progress,
                    **({"runner": runner} if runner else {}),
                )
            except (DatasetError, SlurmError) as exc:
                fail(str(exc))
        write_json_atomic(args.metrics, result.metrics())
        write_json_atomic(args.report, result.report())
        # The logical hash every later stage names the dataset by (`policypipe lineage` links on it).
        digest = fingerprint(args.out).digest
    run.add_inputs([args.manifest])
    # The conversion cache's key besides recordings and params: the exact converter code and libraries.
    run.details["converter"] = converter_identity()
    if runner is not None:  # which array tasks converted what, and how each ended
        run.details["slurm_tasks"] = runner.attempts
    run.add_outputs([args.out, args.metrics, args.report])
    run.outputs[args.out.as_posix() + "#fingerprint"] = digest
    run.write(args.provenance)

    m = result.metrics()
    print(
        f"converted {m['episodes']} episodes, {m['frames']} frames at {m['frequency_hz']:.2f} Hz "
        f"({m['bytes_per_frame']:.0f} bytes/frame, {m['store_files']} files) "
        f"in {time.monotonic() - started:.1f} s; "
        f"fingerprint {digest[:16]}"
    )
    for ex in result.excluded:
        print(f"  excluded {ex['stem']}: {ex['excluded']}: {ex['detail']}")


if __name__ == "__main__":
    main()
