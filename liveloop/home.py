"""Where liveloop keeps what it builds once and reuses from any directory: the embedded default model.

A config names the model by a path (`[engine] model`, `[model] out_dir`; the shipped default is the
relative `models/liveloop-tiny`). `model_path` reads such a path the same way for every command that
builds or loads the model (`liveloop model init`, `serve`, `learn`, `critic pretrain`), so they agree:

1. an absolute path is used as it is;
2. with `$LIVELOOP_HOME` set, a relative path is under it (`$LIVELOOP_HOME/models/liveloop-tiny`);
3. a relative path that exists in the working directory is that one (a model built there before);
4. in a liveloop checkout (the working directory holds pyproject.toml and liveloop/cli.py) it stays
   relative to the checkout, as scripts, tests and CI expect (`models/liveloop-tiny`);
5. anywhere else (an installed wheel run from any directory) it is under the cache,
   `${XDG_CACHE_HOME:-~/.cache}/liveloop/models/liveloop-tiny`: one build per user, not one per
   directory liveloop happens to run in.

Only model paths go through here. The store's SQLite file and the version checkpoints are the
deployment's own data and stay relative to the working directory, as the config says.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "LIVELOOP_HOME"


def in_checkout(cwd: Path | None = None) -> bool:
    """Whether `cwd` (default: the working directory) is the root of a liveloop checkout."""
    cwd = Path.cwd() if cwd is None else cwd
    return (cwd / "pyproject.toml").is_file() and (cwd / "liveloop" / "cli.py").is_file()


def liveloop_home() -> Path:
    """`$LIVELOOP_HOME`, else `${XDG_CACHE_HOME:-~/.cache}/liveloop`."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "liveloop"


def model_path(path: str | Path) -> Path:
    """The directory a config's model path names, by the rules of this module's docstring."""
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    if os.environ.get(HOME_ENV):
        return liveloop_home() / path
    if path.exists() or in_checkout():
        return path
    return liveloop_home() / path
