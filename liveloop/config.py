"""Typed configuration: one frozen dataclass per component, loaded from a TOML file.

This module owns the loader and the top-level `Config` that groups the sections; each component
defines its own dataclass next to its code and receives only that section. Unknown keys and wrong
types fail at load with a `ConfigError` naming the key (e.g. "store.batch_max: expected int, got str").
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the offending key."""


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
    if typing.get_origin(hint) is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {hint!r}")


def load_section(cls: type[T], data: dict[str, Any], prefix: str) -> T:
    """Build the dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in names:
            raise ConfigError(f"{prefix}.{key}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {k: _check_value(v, hints[k], f"{prefix}.{k}") for k, v in data.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix}: {exc}") from exc
    return obj


def _sections() -> dict[str, type]:
    # Imported here so that `liveloop.config` stays importable without the heavy components.
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.model.config import ModelBuildConfig
    from liveloop.monitor.config import MonitorConfig
    from liveloop.server.config import AuthConfig, EngineConfig, ServerConfig
    from liveloop.store.config import StoreConfig

    return {
        "server": ServerConfig,
        "auth": AuthConfig,
        "engine": EngineConfig,
        "store": StoreConfig,
        "model": ModelBuildConfig,
        "learner": LearnerConfig,
        "critic": CriticConfig,
        "monitor": MonitorConfig,
    }


@dataclass(frozen=True)
class Config:
    """All sections of one deployment; each component is handed only its own section."""

    server: Any
    auth: Any
    engine: Any
    store: Any
    model: Any
    learner: Any
    critic: Any
    monitor: Any
    path: str = field(default="<defaults>")

    def with_section(self, name: str, **changes: Any) -> "Config":
        return dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name), **changes)})


def load_sections(sections: dict[str, type], path: str | Path | None = None, text: str | None = None) -> dict[str, Any]:
    """Read a TOML file (or TOML text) into one dataclass per section; unknown sections, keys and
    wrong types are ConfigErrors naming them; a missing section takes its defaults."""
    if text is None and path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        data = tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path or '<text>'}: invalid TOML: {exc}") from exc
    for key in data:
        if key not in sections:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(sorted(sections))})")
    loaded = {}
    for name, cls in sections.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: expected a table")
        loaded[name] = load_section(cls, table, name)
    return loaded


def load_config(path: str | Path | None = None, text: str | None = None) -> Config:
    """Load a deployment config from a TOML file (or TOML text); missing sections take defaults."""
    return Config(**load_sections(_sections(), path, text), path=str(path) if path else "<text>")
