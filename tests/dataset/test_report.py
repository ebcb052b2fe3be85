"""The stats stage's plots (dataset/report.py) on a tiny real store."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from policypipe.dataset import report
from tests.dataset.conftest import make_store


def test_the_contact_sheet_shows_every_episode_up_to_its_cap_then_evenly_spread_ones() -> None:
    assert report.contact_sheet_episodes(5).tolist() == [0, 1, 2, 3, 4]
    shown = report.contact_sheet_episodes(480)  # the demo's export
    assert len(shown) == report.CONTACT_SHEET_EPISODES and (shown[0], shown[-1]) == (0, 479)
    assert (np.diff(shown) >= 4).all() and (np.diff(shown) <= 5).all()  # evenly spread, none repeated


def test_a_store_with_more_episodes_than_the_cap_draws_a_sheet_of_the_cap(
    tmp_path: Path, monkeypatch
) -> None:
    root = make_store(tmp_path / "ds.zarr")  # six episodes
    every = report.write_plots(root, tmp_path / "every", {"train": [0, 1, 2, 3], "val": [4], "test": [5]})
    monkeypatch.setattr(report, "CONTACT_SHEET_EPISODES", 3)
    capped = report.write_plots(root, tmp_path / "capped", {"train": [0, 1, 2, 3], "val": [4], "test": [5]})
    assert report.contact_sheet_episodes(6).tolist() == [0, 2, 5]  # the first, the last, one between
    sheet = {p.name: p for p in every}["contact_sheet.png"], {p.name: p for p in capped}["contact_sheet.png"]
    assert sheet[1].stat().st_size < sheet[0].stat().st_size  # 2x2 thumbnails' room against 3x2
