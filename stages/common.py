"""What every stage script shares: its params section, logging, and a clean failure.

Stage scripts are thin: they read their section of params.yaml into the library's typed
config, call one library function, write the outputs dvc.yaml declares, and the provenance.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import NoReturn, TypeVar

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
    sys.exit(2)
