"""A stage's progress for whoever watches it: a tqdm bar on a terminal; anywhere else (CI,
`make demo > log`, a Slurm job's log) one plain line every few seconds, flushed, with the count,
the rate, the stage's own figures (a loss) and the time left. A bar off a terminal would write a
carriage-return update per step: a 3,000-step run's log as one line of a megabyte.

A stage creates its Progress and passes it in; the library itself never prints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 10.0  # between two plain lines


class Progress:
    """`update(n, **figures)` after each unit of work; `close()` (or a `with` block) at the end."""

    def __init__(
        self,
        total: int,
        *,
        desc: str,
        unit: str,
        initial: int = 0,
        stream: TextIO | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.every_s, self.clock = every_s, clock
        self.initial = self.done = initial
        self.figures: dict[str, str] = {}
        self.bar = None
        if _is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=self.stream
            )
        self.started = self.last_line = clock()
        self.unshown = False  # updates since the last plain line

    def update(self, n: int = 1, **figures: str) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            if figures:
                self.bar.set_postfix(**figures)
            return
        self.figures |= figures  # the last value of each (a validation loss, say) until the next
        self.unshown = True
        now = self.clock()
        if now - self.last_line >= self.every_s or self.done >= self.total:
            self._write(now)

    def line(self, now: float) -> str:
        """The plain line: `train: 1500/3000 step (50%), 12.3 step/s, loss=0.1234, 2m02s left`."""
        elapsed = now - self.started
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        parts = [
            f"{self.desc}: {self.done}/{self.total} {self.unit} ({100 * self.done / max(self.total, 1):.0f}%)"
        ]
        parts.append(f"{rate:.3g} {self.unit}/s" if rate else f"- {self.unit}/s")
        parts += [f"{key}={value}" for key, value in self.figures.items()]
        left = self.total - self.done
        if left <= 0:
            parts.append(f"done in {duration(elapsed)}")
        else:
            parts.append(f"{duration(left / rate)} left" if rate else "time left unknown")
        return ", ".join(parts)

    def _write(self, now: float) -> None:
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()
        self.last_line, self.unshown = now, False

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.unshown:
            self._write(self.clock())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def duration(seconds: float) -> str:
    """42s, 2m05s, 1h02m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
