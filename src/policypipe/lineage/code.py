"""Which source files a piece of code runs, found by reading its imports.

Lineage has to name the code that made an output, and a cache has to miss when that code
changes. Both need the same answer: the transitive closure of a module's (or a stage
script's) imports inside this project. Imports are read with `ast`, not by importing, so the
answer does not depend on what happens to be loaded; imports inside functions count too.
Modules loaded by name at run time are declared in `DYNAMIC_IMPORTS`.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

from policypipe.lineage.hashing import sha256_file, tree_digest

PACKAGE = "policypipe"
# src/policypipe/lineage/code.py -> src/
SOURCE_ROOT = Path(__file__).resolve().parents[2]

# Loaded without an import statement: zarr finds the JPEG codec through the entry point in
# pyproject.toml whenever a store with JPEG frames is opened, so whoever opens one runs it.
DYNAMIC_IMPORTS = {
    f"{PACKAGE}.dataset.layout": (f"{PACKAGE}.dataset.image_codec",),
}


def module_path(module: str, source_root: Path = SOURCE_ROOT) -> Path | None:
    """The file that defines `module` under source_root (a package's __init__.py), or None."""
    base = source_root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path, package: str | None) -> set[str]:
    """Dotted names `path` imports (absolute; `from a import b` also yields a.b, which may be a module)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                if package is None:
                    continue
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _own_modules(name: str) -> list[str]:
    """`policypipe.a.b` -> [policypipe, policypipe.a, policypipe.a.b]: importing runs every parent package."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _package_of(path: Path, source_root: Path) -> str | None:
    """The package a file under source_root belongs to (for relative imports); None outside it."""
    try:
        parts = path.relative_to(source_root).with_suffix("").parts
    except ValueError:
        return None
    return ".".join(parts[:-1])  # policypipe/a/b.py and policypipe/a/__init__.py: package policypipe.a


def import_closure(entry_files: Iterable[Path], source_root: Path = SOURCE_ROOT) -> list[Path]:
    """Every file under source_root that the entry files import, directly or not, plus the
    entry files themselves and their sibling modules imported by plain name (a stage script's
    `from common import ...`, found because Python puts the script's folder on sys.path)."""
    source_root = source_root.resolve()
    seen: set[Path] = set()
    pending = [Path(p).resolve() for p in entry_files]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        package = _package_of(path, source_root)
        for name in sorted(_imported_modules(path, package)):
            if name.split(".")[0] == PACKAGE:
                for module in _own_modules(name):
                    for loaded in (module, *DYNAMIC_IMPORTS.get(module, ())):
                        if (found := module_path(loaded, source_root)) is not None:
                            pending.append(found)
            elif package is None and "." not in name:  # a script's sibling module
                sibling = path.parent / f"{name}.py"
                if sibling.is_file():
                    pending.append(sibling.resolve())
    return sorted(seen)


@functools.cache
def module_code_sha256(module: str, source_root: Path = SOURCE_ROOT) -> str:
    """SHA-256 over the source of `module` and everything it imports inside the project.

    Any changed line in any of those files changes it (comments too: a false miss costs a
    recomputation, a false hit serves stale data).
    """
    entry = module_path(module, source_root)
    if entry is None:
        raise ValueError(f"{module} is not a module under {source_root}")
    return tree_digest(
        {p.relative_to(source_root).as_posix(): sha256_file(p) for p in import_closure([entry], source_root)}
    )
