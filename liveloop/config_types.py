"""Typed configuration values: `ConfigError` and the checks every section goes through. A leaf: it imports
no liveloop module, so every component's config module (server/config.py, learner/config.py, ...) imports
it, and the loader (liveloop/config.py) imports them, without an import circle
(tests/unit/test_import_cycles.py).

- Types: a section's dataclass fields say what a key holds (`int`, `float`, `str`, `bool`, a `Literal`
  enumeration, `tuple[...]` for arrays, `dict[str, ...]` for free tables, a nested dataclass for a
  sub-table, `tuple[SomeDataclass, ...]` for an array of tables like `[[segments]]`). Unknown keys and
  wrong types fail at load with a `ConfigError` naming the key ("store.batch_max: expected int, got
  str"); a `ValueError` from a dataclass's `__post_init__` becomes a `ConfigError` naming the section.
- `check_literals(self)` in a `__post_init__` applies the same `Literal` choices to instances built in
  code: the `Literal` is the one list of choices.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the offending key."""


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_value(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        return tuple(_check_value(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return types.MappingProxyType({str(k): _check_value(v, vt, f"{key}.{k}") for k, v in value.items()})
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {type(value).__name__}")
        return load_section(hint, value, key)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected float, got {type(value).__name__} {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected int, got {type(value).__name__} {value!r}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ConfigError(f"{key}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {hint!r}")


def check_value(value: Any, hint: Any, key: str) -> Any:
    """`value` (parsed TOML) checked against the type `hint` and converted (lists -> tuples, tables ->
    dataclasses); a ConfigError naming `key` when it does not fit."""
    return _check_value(value, hint, key)


def load_section(cls: type[T], data: dict[str, Any], prefix: str) -> T:
    """Build the dataclass `cls` from a TOML table, rejecting unknown keys and wrong types. An empty
    `prefix` is a whole document (its keys are named without a prefix)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in names:
            raise ConfigError(f"{_key(prefix, key)}: unknown key (known: {', '.join(sorted(names))})")
    for f in dataclasses.fields(cls):
        required = f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in data:
            raise ConfigError(f"{_key(prefix, f.name)}: missing")
    kwargs = {k: _check_value(v, hints[k], _key(prefix, k)) for k, v in data.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{prefix}: {exc}" if prefix else str(exc)) from exc
    return obj


def _choices(hint: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return None


def check_literals(obj: Any) -> None:
    """For a dataclass's `__post_init__`: every `Literal` field (and every item of a `tuple[Literal...]`
    field) holds one of its choices, also when the instance is built in code; a ValueError naming the
    field otherwise. The `Literal` is the one list of choices."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        hint, value = hints[f.name], getattr(obj, f.name)
        choices = _choices(hint)
        if choices is not None and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        if typing.get_origin(hint) is tuple and (item := _choices((typing.get_args(hint) or (None,))[0])) is not None:
            for i, v in enumerate(value):
                if v not in item:
                    raise ValueError(f"{f.name}[{i}] must be one of {', '.join(map(str, item))}, got {v!r}")


def _empty(hint: Any) -> Any:
    """What a section that the file leaves out reads as: an empty table or an empty array."""
    return [] if typing.get_origin(hint) is tuple else {}


def check_sections(sections: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """One typed value per section of parsed TOML: a dataclass per table, or any type `check_value`
    takes (`tuple[Segment, ...]` for `[[segments]]`, `dict[str, Any]` for a free table). Unknown
    sections, keys and wrong types are ConfigErrors naming them; a missing section takes its defaults."""
    for key in data:
        if key not in sections:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(sorted(sections))})")
    loaded = {}
    for name, hint in sections.items():
        table = data.get(name, _empty(hint))
        if dataclasses.is_dataclass(hint) and not isinstance(table, dict):
            raise ConfigError(f"{name}: expected a table")
        loaded[name] = _check_value(table, hint, name)
    return loaded
