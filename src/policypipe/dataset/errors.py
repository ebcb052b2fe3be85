"""Why a dataset cannot be built: a config that cannot work, or a disk that filled up."""

from __future__ import annotations

import errno


class DatasetError(Exception):
    """The dataset cannot be built as configured; the message says what to change."""


class DiskFullError(DatasetError):
    """No space left while writing `path`; `needed` bytes is what the write in hand needed."""

    def __init__(self, path: str, needed: int, frames: int) -> None:
        super().__init__(path, needed, frames)  # as args, so it crosses the process pool intact
        self.path, self.needed, self.frames = path, needed, frames

    def __str__(self) -> str:
        return f"no space left on the device writing {self.path} ({megabytes(self.needed)} needed for it)"


def megabytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
