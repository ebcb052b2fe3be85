"""Slurm's warning before it ends a job (`--signal=USR1@120`, or SIGTERM at preemption) as a
request that training honours at its next step boundary: a checkpoint, then an exit that asks
for the job to be requeued. A signal handler only sets a flag: saving from inside one would
catch the weights half-updated."""

from __future__ import annotations

import logging
import signal
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    """Set by SIGUSR1 or SIGTERM once installed; `uninstall` restores the previous handlers."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, object] = {}

    def __bool__(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            log.warning("%s received: checkpointing at the next step boundary, then exiting", self.signal)

    def install(self) -> StopRequest:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
