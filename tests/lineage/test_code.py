from __future__ import annotations

import re
from pathlib import Path

import yaml

from policypipe.lineage.code import import_closure, module_code_sha256
from tests.conftest import REPO_ROOT

# The environment decides numbers too: the lock, and pyproject.toml for the torch pin the lock leaves out.
ENVIRONMENT_FILES = {"requirements.lock", "pyproject.toml"}


def _stages() -> dict[str, dict]:
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]


def test_every_stage_depends_on_exactly_the_code_it_imports_and_the_environment() -> None:
    for name, stage in _stages().items():
        script = re.search(r"python (stages/\S+\.py)", stage["cmd"])[1]
        closure = {p.relative_to(REPO_ROOT).as_posix() for p in import_closure([REPO_ROOT / script])}
        deps = {d if isinstance(d, str) else next(iter(d)) for d in stage["deps"]}
        code_deps = {d for d in deps if d.startswith(("src/", "stages/"))}
        assert closure - code_deps == set(), f"dvc.yaml stage {name} misses code it imports"
        assert code_deps - closure == set(), f"dvc.yaml stage {name} lists code it does not import"
        assert ENVIRONMENT_FILES <= deps, f"dvc.yaml stage {name} must depend on {sorted(ENVIRONMENT_FILES)}"


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_closure_follows_every_kind_of_import_and_nothing_else(tmp_path: Path) -> None:
    src = _package(
        tmp_path / "src",
        {
            "policypipe/__init__.py": "",
            "policypipe/a/__init__.py": "",
            "policypipe/a/top.py": "from policypipe.a import sub\nfrom . import rel\nimport numpy\n",
            "policypipe/a/sub.py": "def f():\n    import policypipe.b.lazy\n",
            "policypipe/a/rel.py": "from .. import c\n",
            "policypipe/b/__init__.py": "",
            "policypipe/b/lazy.py": "",
            "policypipe/c.py": "",
            "policypipe/unused.py": "",
        },
    )
    scripts = _package(
        tmp_path / "stages", {"s.py": "from common import x\nfrom policypipe.a import top\n", "common.py": ""}
    )
    closure = {p.relative_to(tmp_path).as_posix() for p in import_closure([scripts / "s.py"], src)}
    assert closure == {
        "stages/s.py",
        "stages/common.py",
        "src/policypipe/__init__.py",
        "src/policypipe/a/__init__.py",
        "src/policypipe/a/top.py",
        "src/policypipe/a/sub.py",
        "src/policypipe/a/rel.py",
        "src/policypipe/b/__init__.py",
        "src/policypipe/b/lazy.py",
        "src/policypipe/c.py",
    }


def test_code_hash_changes_with_any_line_of_any_imported_file(tmp_path: Path) -> None:
    files = {
        "policypipe/__init__.py": "",
        "policypipe/m.py": "import policypipe.dep\n",
        "policypipe/dep.py": "X = 1\n",
        "policypipe/other.py": "",
    }
    src = _package(tmp_path / "src", files)
    before = module_code_sha256("policypipe.m", src)
    (src / "policypipe/other.py").write_text("Y = 2\n")  # not imported: no change
    module_code_sha256.cache_clear()
    assert module_code_sha256("policypipe.m", src) == before
    (src / "policypipe/dep.py").write_text("X = 1  # a comment\n")
    module_code_sha256.cache_clear()
    assert module_code_sha256("policypipe.m", src) != before
