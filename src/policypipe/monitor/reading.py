"""The monitor's reading of one chunk, as the runner returns it and the server sends it.

NumPy-free and torch-free: the robot side (`serving.client`) holds readings without the model's
libraries."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class MonitorReading:
    """The scores of one chunk (`monitor.scores`): novelty of the observation, inconsistency with the
    previous chunk (NaN for an episode's first), the persistent combined score over its calibrated
    threshold, and the alarm (score > 1 from the persist-th chunk of an episode on)."""

    novelty: float
    inconsistency: float
    score: float
    alarm: bool

    def fields(self) -> dict[str, Any]:
        """As the server sends it and `policypipe predict` writes it: NaN as None (null)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_fields(cls, fields: Any) -> MonitorReading:
        """From `fields()`'s map (a server's reply); ValueError for anything else."""
        if not isinstance(fields, dict) or set(fields) != {"novelty", "inconsistency", "score", "alarm"}:
            raise ValueError(
                f"a monitor reading has novelty, inconsistency, score and alarm, not {fields!r:.200}"
            )
        number = lambda v: math.nan if v is None else float(v)  # noqa: E731
        return cls(
            number(fields["novelty"]),
            number(fields["inconsistency"]),
            number(fields["score"]),
            bool(fields["alarm"]),
        )
