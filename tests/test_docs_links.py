"""Every relative link of the README and docs/ leads somewhere: the file exists, and a #anchor
names one of its headings, slugged as GitHub does."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def prose(path: Path) -> str:
    """The file without its fenced code, where brackets and #s are code, not links or headings."""
    return FENCE.sub("", path.read_text())


def github_anchor(heading: str) -> str:
    """GitHub's slug: lowercase, punctuation dropped (hyphens and underscores kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(path), re.M):
        slug, n = github_anchor(heading), 1
        while slug in found:  # a repeated heading gets -1, -2, ...
            slug, n = f"{github_anchor(heading)}-{n}", n + 1
        found.add(slug)
    return found


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("Export: `policypipe export lerobot DATASET OUT --task TEXT`") == (
        "export-policypipe-export-lerobot-dataset-out---task-text"
    )
    assert github_anchor("The simulator (`synthetic/simulator.py`)") == "the-simulator-syntheticsimulatorpy"
    assert github_anchor("What `run_dir` holds") == "what-run_dir-holds"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not this test's to check
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(f"{target}: no {os.path.relpath(linked, REPO_ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading of {linked.name} has the anchor #{anchor}")
    assert not broken, f"{doc.relative_to(REPO_ROOT)}:\n" + "\n".join(broken)
