"""Typed, frozen stage configs built from a `params.yaml` section.

The library never reads `params.yaml` itself: a stage script loads its section and calls
`from_mapping`, which rejects unknown keys (a typo must not silently fall back to a default)
and wrong types, naming the key and what to change, before any work starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which key and what to change."""


def read_section(params_file: Path, section: str) -> dict[str, Any]:
    """One section of params.yaml as a dict; a missing file or section says what to do.

    Parsed as YAML 1.2, as DVC parses it: what `dvc params diff` shows is what the stage gets.
    (A YAML 1.1 parser reads the `no` that `dvc exp run -S` writes unquoted as false, and
    `3e-4` as a string.)
    """
    from ruamel.yaml import YAML

    params_file = Path(params_file)
    if not params_file.is_file():
        raise ConfigError(
            f"{params_file} not found in {Path.cwd()}: run from the repository root (dvc repro does)"
        )
    params = YAML(typ="safe", pure=True).load(params_file.read_text()) or {}
    if section not in params:
        raise ConfigError(
            f"{params_file} has no [{section}] section; add it (see docs/pipeline.md, 'Parameters')"
        )
    return params[section] or {}


def from_mapping(cls: type[T], mapping: Mapping[str, Any] | None, section: str) -> T:
    mapping = dict(mapping or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        raise ConfigError(
            f"params.yaml [{section}]: unknown key(s) {', '.join(unknown)}; "
            f"known keys are: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    values = {name: _coerce(value, hints[name], f"{section}.{name}") for name, value in mapping.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params.yaml [{section}]: {exc}") from exc


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: must not be null")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(hint))}"
            )
        return from_mapping(hint, value, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def require_same_window(stats: Mapping[str, Any], window: Mapping[str, Any], used_by: str) -> None:
    """Refuses statistics computed for other windows than `used_by` (a policy, params.yaml) has.

    The `policy` section is the one place window sizes are set; stats.json records what it was
    computed with. Normalising horizon-16 actions with horizon-8 statistics runs without an error
    and learns something else, so a mismatch stops the stage instead.
    """
    recorded = stats.get("window")
    wanted = {k: window[k] for k in ("n_obs_steps", "horizon", "n_action_steps")}
    if recorded != wanted:
        raise ConfigError(
            f"the statistics were computed for windows {recorded}, {used_by} has {wanted}: "
            "the [policy] section of "
            "params.yaml changed since `stats` ran; run `dvc repro` (it reruns stats, then train and eval)"
        )
