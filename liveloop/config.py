"""Typed configuration: one frozen dataclass per section, loaded from a TOML file; presets by name.

This module owns the one loader every TOML file goes through (deployment configs, the BGPO job, the
experiments, scenario files) and the top-level `Config` that groups a deployment's sections; each
component defines its own dataclass next to its code and receives only that section.

- Types: the typed checks (`ConfigError` naming the key, `check_literals`, `load_section`; re-exported
  here) live in the leaf liveloop/config_types.py, which the component config modules import instead of
  this loader, so the loader imports them without an import circle.
- Presets: configs/<kind>/<name>.toml (kinds: serve, experiments, scenarios, jobs, suites, fragments),
  named by the file's name alone (`resolve_config`: a name or a path; the CLI's `--config` takes both),
  found through the package data of `liveloop.configs` from a checkout, an editable install or a wheel.
- Weight: loading a config imports no torch (nor any engine or trainer): the section dataclasses live
  in torch-free modules (tests/unit/test_config.py checks every preset in a fresh interpreter).
- `extends = "NAME"` (or a path, or a list): that file first, this one's values merged over it table by
  table (`_resolve_extends`), so a shared piece (configs/fragments/) is named, never copied. Relative
  paths inside a config (data/) stay relative to the directory liveloop runs in; a model path is read by
  `liveloop.home.model_path`.
- Moved keys (`MOVED`): a knob that moved to its own component's section is still read from an older
  file, with a warning.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the typed checks live in a leaf the component configs import (no circle); re-exported for the callers here
from liveloop.config_types import ConfigError, check_literals, check_sections, check_value, load_section

if TYPE_CHECKING:
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.model.config import ModelBuildConfig
    from liveloop.monitor.config import MonitorConfig
    from liveloop.ray_config import RayConfig
    from liveloop.release.config import ReleaseConfig
    from liveloop.segments import SegmentsConfig
    from liveloop.server.config import AuthConfig, EngineConfig, ServerConfig
    from liveloop.store.config import StoreConfig
    from liveloop.transport.config import TransportConfig

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_DIR", "Config", "ConfigError", "check_literals", "check_sections", "check_value", "load_config",
    "load_section", "load_sections", "merge", "move_keys", "preset_kinds", "presets", "read_toml", "resolve_config",
]


def _preset_dir() -> Path:
    """The presets' folder: the package `liveloop.configs` (the repository's configs/ in a checkout or an
    editable install; site-packages/liveloop/configs from a wheel)."""
    return Path(str(importlib.resources.files("liveloop.configs")))


CONFIG_DIR = _preset_dir()


# -- presets and files -----------------------------------------------------------------------------

def _preset_files() -> dict[str, list[Path]]:
    """preset name -> its files (one, unless two kinds reuse a name): configs/<kind>/<name>.toml."""
    found: dict[str, list[Path]] = {}
    for path in sorted(CONFIG_DIR.glob("*/*.toml")):
        found.setdefault(path.stem, []).append(path)
    return found


def presets() -> list[str]:
    """The preset names: every configs/<kind>/<name>.toml (the package data of `liveloop.configs`)."""
    return sorted(_preset_files())


def preset_kinds() -> dict[str, list[str]]:
    """kind (the folder: serve, experiments, scenarios, jobs, suites, fragments) -> its preset names."""
    kinds: dict[str, list[str]] = {}
    for path in sorted(CONFIG_DIR.glob("*/*.toml")):
        kinds.setdefault(path.parent.name, []).append(path.stem)
    return kinds


def resolve_config(name_or_path: str | Path) -> Path:
    """A preset name ("drift_experiment" -> <repository>/configs/experiments/drift_experiment.toml, from
    any working directory: the name alone, whatever its kind's folder) or a path to a TOML file (it
    contains "/" or ends in ".toml"; relative to the working directory). A name that is no preset is a
    ConfigError listing the presets. A path to where a preset lived before the presets were grouped
    (configs/<name>.toml, now missing) reads the preset, with a warning."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith(".toml"):
        path = Path(name_or_path)
        if path.suffix == ".toml" and not path.exists() and path.parent.resolve() == CONFIG_DIR.resolve() and path.stem in presets():
            moved = resolve_config(path.stem)
            log.warning("%s: the presets are grouped by kind now: this one is %s (pass its name, %r)", path, moved, path.stem)
            return moved
        return path
    files = _preset_files().get(text)
    if not files:
        raise ConfigError(f"{text}: no preset of that name in {CONFIG_DIR} (presets: {', '.join(presets())}; or pass a path to a .toml file)")
    if len(files) > 1:
        raise ConfigError(f"{text}: two presets of that name ({', '.join(map(str, files))}): pass a path")
    return files[0]


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
    """`extends = "NAME"` or `extends = ["A", "B"]` (names, or paths relative to the file): the presets
    merged in order (B over A), then this file's own values over them, table by table (arrays are
    replaced whole). So a shared piece lives in one file and is referred to by name, never copied
    (`fragments/tuned_learner.toml`; `fragments/feedback_delay.toml`, the `[scenario.feedback_delay]`
    every shipped scenario extends)."""
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
        path = resolve_config(here / name if is_path and here is not None else name).resolve()  # a path: relative to the file
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


# -- typed documents -------------------------------------------------------------------------------

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
    from liveloop.segments import SegmentsConfig
    from liveloop.server.config import AuthConfig, EngineConfig, ServerConfig
    from liveloop.store.config import StoreConfig
    from liveloop.transport.config import TransportConfig

    return {
        "server": ServerConfig,
        "auth": AuthConfig,
        "engine": EngineConfig,
        "store": StoreConfig,
        "model": ModelBuildConfig,
        "segments": SegmentsConfig,
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
    segments: SegmentsConfig
    learner: LearnerConfig
    critic: CriticConfig
    monitor: MonitorConfig
    transport: TransportConfig
    ray: RayConfig
    release: ReleaseConfig
    path: str = field(default="<defaults>")

    def __post_init__(self) -> None:
        from liveloop.learner.config import check_adapters

        check_adapters(self.learner, self.segments)

    def transport_for_store(self) -> TransportConfig:
        """`[transport]` with its namespace resolved: "auto" names this deployment's shared memory after
        its store, so two deployments on one machine never read each other's weights."""
        return self.transport.for_deployment(self.store.url)

    def with_section(self, name: str, **changes: Any) -> "Config":
        return dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name), **changes)})


# keys that moved to their component's own section: an older file still loads (the value is read from
# the new place, with a warning); setting both to different values is an error naming the new key
MOVED = {
    "learner.segment_key": "server.segment_key",
    # which adapters serve and train, and the segments with their own: the server's as much as the learner's
    "learner.adapters": "segments.adapters",
    "learner.segments": "segments.names",
    # every serving process is a replica of its fleet (a plain `liveloop serve` one of one): not Ray's
    "ray.replica_id": "server.replica_id",
    "ray.heartbeat_seconds": "server.heartbeat_seconds",
    "ray.down_after_seconds": "server.down_after_seconds",
    "ray.leader_lease_seconds": "server.leader_lease_seconds",
}


def move_keys(data: dict[str, Any], where: str, moved: dict[str, str] = MOVED) -> dict[str, Any]:
    """`data` (a document's tables) with every `moved` key read from its old place into its new one, with a
    warning naming the new place; a ConfigError when both are set to different values."""
    for old, new in moved.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        table = data.get(old_section)
        if not isinstance(table, dict) or old_key not in table:
            continue
        value, target = table[old_key], data.get(new_section, {})
        if isinstance(target, dict) and new_key in target and target[new_key] != value:
            raise ConfigError(f"{old}: moved to {new}, which {where} sets to another value: keep {new} alone")
        log.warning("%s: %s moved to %s (read from there; rename it in the file)", where, old, new)
        data = {**data, old_section: {k: v for k, v in table.items() if k != old_key}}
        if isinstance(target, dict):
            data[new_section] = {**target, new_key: value}
    return data


def load_config(path: str | Path | None = None, text: str | None = None) -> Config:
    """Load a deployment config: a preset name ("default", "production"), a path to a TOML file, or
    TOML text; missing sections take their defaults."""
    where = str(resolve_config(path)) if path is not None and text is None else "<text>"
    return Config(**check_sections(_sections(), move_keys(read_toml(path, text), where)), path=where)
