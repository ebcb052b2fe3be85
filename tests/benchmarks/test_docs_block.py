"""The docs' measured figures come from the benchmark that measures them (docs_block)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.bench_convert import codec_docs
from tests.benchmarks.docs_block import replace_block

REPO = Path(__file__).resolve().parents[2]


def test_a_block_is_replaced_between_its_markers_and_nothing_else(tmp_path: Path) -> None:
    docs = tmp_path / "doc.md"
    docs.write_text("before\n<!-- bench:codecs by a command -->\nold\nlines\n<!-- /bench:codecs -->\nafter\n")
    replace_block(docs, "codecs", "new\n")
    assert (
        docs.read_text() == "before\n<!-- bench:codecs by a command -->\nnew\n<!-- /bench:codecs -->\nafter\n"
    )


def test_a_file_without_the_block_is_refused_naming_it(tmp_path: Path) -> None:
    docs = tmp_path / "doc.md"
    docs.write_text("no block here\n")
    with pytest.raises(SystemExit, match=r"doc.md: expected one block <!-- bench:codecs"):
        replace_block(docs, "codecs", "new")
    assert docs.read_text() == "no block here\n"


def test_the_codec_figures_in_the_docs_are_the_benchmarks_own() -> None:
    # What the benchmark writes has this shape; the docs hold such a block, not typed figures.
    text = codec_docs([("JPEG q95 (chosen)", 4000.0, 110.0), ("PNG", 13000.0, 300.0)], 500, (96, 96))
    assert "| JPEG q95 (chosen) | 4,000 | 110 |" in text and "3.2x smaller" in text
    docs = (REPO / "docs/dataset.md").read_text()
    block = docs.split("<!-- bench:codecs ", 1)[1].split("<!-- /bench:codecs -->")[0]
    assert (
        "| codec | bytes/frame | decode µs/frame |" in block and "x smaller than the best lossless" in block
    )
