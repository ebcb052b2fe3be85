"""Stage `pair`: export folder -> manifest of exactly paired recordings, and a report of the rest."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from common import fail, load_config, setup_logging

from policypipe.atomic import write_json_atomic
from policypipe.lineage.provenance import StageRun
from policypipe.recordings.pairing import PairConfig, pair_export, summary_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export", type=Path, required=True, help="export folder (input)")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True, help="every rejected file with its reason")
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--provenance", type=Path, required=True)
    args = parser.parse_args()
    setup_logging()
    config = load_config("pair", PairConfig)

    with StageRun("pair", params=asdict(config)) as run:
        try:
            result = pair_export(args.export, config)
        except FileNotFoundError as exc:
            fail(f"{exc}; put the studio's export there (or run `make demo` for sample data)")
        except PermissionError as exc:
            fail(f"{exc}; give this user read and execute permission on it (chmod a+rx)")
        write_json_atomic(args.manifest, result.manifest())
        write_json_atomic(args.report, result.report())
        write_json_atomic(args.metrics, result.metrics())
    run.inputs[args.export.as_posix()] = result.export_sha256
    run.add_outputs([args.manifest, args.report, args.metrics])
    run.write(args.provenance)

    for line in summary_lines(result):
        print(line)
    if not result.recordings:
        fail(f"no recording in {args.export} could be paired: see {args.report} for every file's reason")


if __name__ == "__main__":
    main()
