"""Stage `check_export`: the export folder walked before DVC hashes it for `pair`.

It runs on every `dvc repro` (`always_changed`) and only lists and stats: DVC would wait forever
on a named pipe in the export and fail without naming the file on a link loop or a name that is
not UTF-8 (src/policypipe/recordings/export_check.py). No provenance record: it makes nothing
from its input, and a record with the run's time would change on every run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import fail

from policypipe.atomic import write_json_atomic
from policypipe.recordings.export_check import export_hazards, tracked_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export", type=Path, required=True, help="export folder (pair's input)")
    parser.add_argument("--out", type=Path, required=True, help="what was checked (JSON)")
    args = parser.parse_args()

    if not args.export.is_dir():
        if args.out.is_file():
            # A server that pulled only what training needs: nothing to check, pair's input as
            # recorded (the output is `persist`, DVC did not delete it), so DVC skips pair.
            print(f"{args.export} is not here: nothing to check, {args.out} kept as recorded")
            return
        fail(
            f"export folder {args.export} does not exist; put the studio's export there "
            "(or run `make demo` for sample data)"
        )
    try:
        hazards = export_hazards(args.export)
    except PermissionError as exc:
        fail(f"{exc}; give this user read and execute permission on it (chmod a+rx)")
    if hazards:
        lines = "\n".join(f"  {(args.export / h.path).as_posix()}: {h.detail}" for h in hazards)
        fail(
            f"{args.export} holds {len(hazards)} entr{'y' if len(hazards) == 1 else 'ies'} that DVC cannot "
            f"hash (it would hang or fail before pair could report them):\n{lines}\n"
            f"Move or fix them, then run dvc repro again; `policypipe pair {args.export} -v` checks the "
            "whole export"
        )
    tracked = tracked_files(args.export)
    # Deterministic: the same export gives the same bytes, so DVC does not rerun pair for this file.
    write_json_atomic(
        args.out, {"export": args.export.as_posix(), "files": tracked.files, "bytes": tracked.bytes}
    )


if __name__ == "__main__":
    main()
