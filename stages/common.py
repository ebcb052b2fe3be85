"""What every stage script shares: its params section, logging, and a clean failure.

Stage scripts are thin: they read their section of params.yaml into the library's typed
config, call one library function, write the outputs dvc.yaml declares, and the provenance.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn, TypeVar

import yaml

from policypipe.config import ConfigError, from_mapping, read_section

T = TypeVar("T")
PARAMS_FILE = Path("params.yaml")


def setup_logging() -> None:
    # Line-buffered, so logs show up as they happen under `dvc repro`, tmux or a pipe.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def load_config(section: str, cls: type[T]) -> T:
    try:
        return from_mapping(cls, read_section(PARAMS_FILE, section), section)
    except ConfigError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    # Under `dvc repro` (which names the stage in DVC_STAGE), DVC removed the stage's outputs
    # before running it: the last good ones are still in its cache, and dvc.lock still names them.
    if removed := _removed_by_dvc(os.environ.get("DVC_STAGE")):
        print(
            f"DVC removed {', '.join(removed)} before running the stage; the last good version is in "
            f"its cache: `dvc checkout {' '.join(removed)}` brings it back",
            file=sys.stderr,
        )
    sys.exit(2)


def _removed_by_dvc(stage: str | None) -> list[str]:
    """The stage's outputs DVC deletes before it runs and can restore: cached, not `persist`."""
    if not stage:
        return []
    try:
        outs = yaml.safe_load(Path("dvc.yaml").read_text())["stages"][stage].get("outs", [])
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return []
    removed = []
    for out in outs:
        path, options = (out, {}) if isinstance(out, str) else next(iter(out.items()))
        options = options or {}
        if options.get("cache", True) and not options.get("persist", False):
            removed.append(path)
    return removed
