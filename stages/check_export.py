"""Stage `check_export`: the export folder checked, then hashed, for `pair` to depend on.

It runs on every `dvc repro` (`always_changed`): it walks the folder without opening anything but
regular files, fails naming what DVC or pair could not read (a named pipe would make DVC wait
forever), and writes the export's content digest, which `pair` depends on instead of the folder
(src/policypipe/recordings/export_check.py). Unchanged files are not read again (a local stat
cache). No provenance record: its output is that digest, and a record with the run's time would
change on every run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import fail

from policypipe.atomic import write_json_atomic
from policypipe.recordings.export_check import ExportListing, unversioned_change


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export", type=Path, required=True, help="export folder (pair's input)")
    parser.add_argument("--out", type=Path, required=True, help="what was checked (JSON)")
    parser.add_argument(
        "--cache", type=Path, required=True, help="file hashes by size, mtime and inode (not a DVC output)"
    )
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
        listing = ExportListing.of(args.export)  # one walk, for every question below
        hazards = listing.hazards()
    except PermissionError as exc:
        fail(f"{exc}; give this user read and execute permission on it (chmod a+rx)")
    if hazards:
        lines = "\n".join(f"  {(args.export / h.path).as_posix()}: {h.detail}" for h in hazards)
        fail(
            f"{args.export} holds {len(hazards)} entr{'y' if len(hazards) == 1 else 'ies'} that cannot be "
            "read as files (a reader would wait forever on a pipe; `dvc add` hangs or fails on them):\n"
            f"{lines}\n"
            f"Move or fix them, then run dvc repro again; `policypipe pair {args.export} -v` checks the "
            "whole export"
        )
    content = listing.content(args.cache)
    if unversioned := unversioned_change(listing, args.export.with_name(args.export.name + ".dvc")):
        print(f"warning: {unversioned}", file=sys.stderr)
    # Deterministic: the same files give the same bytes, so DVC reruns pair only when they change.
    write_json_atomic(
        args.out,
        {
            "export": args.export.as_posix(),
            "files": content.files,
            "bytes": content.bytes,
            "sha256": content.sha256,
        },
    )


if __name__ == "__main__":
    main()
