"""A benchmark's figures written into the docs, not typed there: the text between
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in a Markdown file is replaced by what the
benchmark measured, and the markers say which command wrote it."""

from __future__ import annotations

import re
from pathlib import Path

from policypipe.atomic import write_bytes_atomic


def replace_block(path: Path, name: str, text: str) -> None:
    """Replaces the block `name` of `path` with `text`; refuses a file without exactly one."""
    source = path.read_text()
    pattern = re.compile(
        rf"(<!-- bench:{re.escape(name)} [^\n]*-->\n).*?(<!-- /bench:{re.escape(name)} -->)", re.S
    )
    found = pattern.findall(source)
    if len(found) != 1:
        raise SystemExit(
            f"{path}: expected one block <!-- bench:{name} ... --> ... <!-- /bench:{name} -->, "
            f"found {len(found)}"
        )
    write_bytes_atomic(path, pattern.sub(lambda m: m[1] + text.rstrip("\n") + "\n" + m[2], source).encode())
