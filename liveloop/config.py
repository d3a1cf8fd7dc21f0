"""Typed configuration: one frozen dataclass per section, loaded from a TOML file; presets by name.

This module owns the one loader every TOML file goes through (deployment configs, the BGPO job, the
experiments, scenario files) and the top-level `Config` that groups a deployment's sections; each
component defines its own dataclass next to its code and receives only that section.

- Types: a section's dataclass fields say what a key holds (`int`, `float`, `str`, `bool`, a `Literal`
  enumeration, `tuple[...]` for arrays, `dict[str, ...]` for free tables, a nested dataclass for a
  sub-table, `tuple[SomeDataclass, ...]` for an array of tables like `[[segments]]`). Unknown keys and
  wrong types fail at load with a `ConfigError` naming the key ("store.batch_max: expected int, got
  str"); a `ValueError` from a dataclass's `__post_init__` becomes a `ConfigError` naming the section.
  `check_literals(self)` in a `__post_init__` applies the same `Literal` choices to instances built in code.
- Presets: `resolve_config(x)` takes a preset name or a path. A name (no "/", no ".toml") is
  `configs/<name>.toml` of this repository, found from any working directory (`default`, `production`,
  `bgpo`, `drift`, `drift_experiment`, `tuned_learner`, ...); anything else is a path. The CLI's
  `--config` accepts both. configs/ installs as the package data of `liveloop.configs`, and
  `CONFIG_DIR` is found with importlib.resources: the same names work from a checkout, an editable
  install and an installed wheel.
- Weight: loading a config imports no torch (nor any engine or trainer): the section dataclasses live
  in torch-free modules (tests/unit/test_config.py checks every preset in a fresh interpreter).
- `extends`: a file may start with `extends = "NAME"` (or a path, relative to the file): that file is
  read first and this file's own values are merged over it, table by table (arrays are replaced whole).
  So a preset lives in one file and is referred to by name, never copied (`configs/tuned_learner.toml`).
  Relative paths inside a config (data/) stay relative to the directory liveloop runs in; a model path
  (`[engine] model`, `[model] out_dir`) is read by `liveloop.home.model_path` (outside a checkout the
  default model lives in the user's cache, `$LIVELOOP_HOME` or ~/.cache/liveloop).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.model.config import ModelBuildConfig
    from liveloop.monitor.config import MonitorConfig
    from liveloop.ray_config import RayConfig
    from liveloop.release.config import ReleaseConfig
    from liveloop.server.config import AuthConfig, EngineConfig, ServerConfig
    from liveloop.store.config import StoreConfig
    from liveloop.transport.config import TransportConfig

T = TypeVar("T")


def _preset_dir() -> Path:
    """The presets' folder: the package `liveloop.configs` (the repository's configs/ in a checkout or an
    editable install; site-packages/liveloop/configs from a wheel)."""
    return Path(str(importlib.resources.files("liveloop.configs")))


CONFIG_DIR = _preset_dir()


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the offending key."""


# -- presets and files -----------------------------------------------------------------------------

def presets() -> list[str]:
    """The preset names: every configs/<name>.toml (the package data of `liveloop.configs`)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """A preset name ("drift_experiment" -> <repository>/configs/drift_experiment.toml, from any working
    directory) or a path to a TOML file (it contains "/" or ends in ".toml"; relative to the working
    directory). A name that is no preset is a ConfigError listing the presets."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith(".toml"):
        return Path(name_or_path)
    path = CONFIG_DIR / f"{text}.toml"
    if not path.is_file():
        raise ConfigError(f"{text}: no preset of that name in {CONFIG_DIR} (presets: {', '.join(presets())}; or pass a path to a .toml file)")
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    return _parse(text, str(path))


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from exc


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over`'s values over `base`'s: tables merge key by key (recursively), anything else (scalars,
    arrays, arrays of tables) is replaced whole. Neither argument is modified."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve_extends(data: dict[str, Any], where: str, here: Path | None, seen: tuple[Path, ...]) -> dict[str, Any]:
    """`extends = "NAME"` or `extends = ["A", "B"]`: the presets merged in order (B over A), then this
    file's own values over them."""
    if "extends" not in data:
        return data
    data = dict(data)
    names = data.pop("extends")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: extends: expected a preset name, a path or a list of them, got {names!r}")
    base: dict[str, Any] = {}
    for name in names:
        is_path = "/" in name or name.endswith(".toml")
        path = (here / name if is_path and here is not None else resolve_config(name)).resolve()  # a path: relative to the file
        if path in seen:
            raise ConfigError(f"{where}: extends: {name!r} extends itself ({' -> '.join(str(p) for p in (*seen, path))})")
        base = merge(base, _resolve_extends(_read(path), str(path), path.parent, (*seen, path)))
    return merge(base, data)


def read_toml(config: str | Path | None = None, text: str | None = None) -> dict[str, Any]:
    """The TOML of a preset name or a path (or of `text`), with its `extends` chain merged in."""
    if text is not None:
        return _resolve_extends(_parse(text, "<text>"), "<text>", None, ())
    if config is None:
        return {}
    path = resolve_config(config)
    data = _read(path)
    here = path.resolve()
    return _resolve_extends(data, str(path), here.parent, (here,))


# -- typed sections --------------------------------------------------------------------------------

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


def load_sections(sections: dict[str, Any], path: str | Path | None = None, text: str | None = None) -> dict[str, Any]:
    """Read a TOML file (a preset name or a path; or TOML text), `extends` merged in, into one typed
    value per section (`check_sections`)."""
    return check_sections(sections, read_toml(path, text))


# -- the deployment config -------------------------------------------------------------------------

def _sections() -> dict[str, type]:
    # Imported here so that `liveloop.config` stays importable without the heavy components.
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.model.config import ModelBuildConfig
    from liveloop.monitor.config import MonitorConfig
    from liveloop.ray_config import RayConfig
    from liveloop.release.config import ReleaseConfig
    from liveloop.server.config import AuthConfig, EngineConfig, ServerConfig
    from liveloop.store.config import StoreConfig
    from liveloop.transport.config import TransportConfig

    return {
        "server": ServerConfig,
        "auth": AuthConfig,
        "engine": EngineConfig,
        "store": StoreConfig,
        "model": ModelBuildConfig,
        "learner": LearnerConfig,
        "critic": CriticConfig,
        "monitor": MonitorConfig,
        "transport": TransportConfig,
        "ray": RayConfig,
        "release": ReleaseConfig,
    }


@dataclass(frozen=True)
class Config:
    """All sections of one deployment; each component is handed only its own section."""

    server: ServerConfig
    auth: AuthConfig
    engine: EngineConfig
    store: StoreConfig
    model: ModelBuildConfig
    learner: LearnerConfig
    critic: CriticConfig
    monitor: MonitorConfig
    transport: TransportConfig
    ray: RayConfig
    release: ReleaseConfig
    path: str = field(default="<defaults>")

    def transport_for_store(self) -> TransportConfig:
        """`[transport]` with its namespace resolved: "auto" names this deployment's shared memory after
        its store, so two deployments on one machine never read each other's weights."""
        return self.transport.for_deployment(self.store.url)

    def with_section(self, name: str, **changes: Any) -> "Config":
        return dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name), **changes)})


def load_config(path: str | Path | None = None, text: str | None = None) -> Config:
    """Load a deployment config: a preset name ("default", "production"), a path to a TOML file, or
    TOML text; missing sections take their defaults."""
    where = str(resolve_config(path)) if path is not None and text is None else "<text>"
    return Config(**load_sections(_sections(), path, text), path=where)
