"""Matplotlib for files only, and one way to save a figure: atomically, without a version stamp."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display; set before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402

# PNG bytes must not depend on the matplotlib version that wrote them.
_PNG_METADATA = {"Software": None}


def save_png(fig, path: Path, dpi: int = 100) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=dpi, metadata=_PNG_METADATA, format="png")
    plt.close(fig)
    tmp.replace(path)
    return path
