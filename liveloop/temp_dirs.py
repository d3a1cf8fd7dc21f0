"""Temporary directories a liveloop process owns, named by its pid, and the sweep of the ones a process
no longer alive left behind.

A process removes its own directories when it stops; one killed with SIGKILL (or by the OOM killer)
cannot. Every such directory is therefore named `liveloop-KIND-PID-XXXXXXXX` under the temporary
directory, and the first directory a process makes of a kind sweeps that kind's directories whose PID
is not alive. Kinds: `verified` (private checkpoint copies, transport/checkpoint_dir.py), `ray` (the
local Ray's sockets and logs, learner/actor.py), `staging` (vLLM's swap bell, server/engines/vllm),
`ranks` (the learner ranks' rendezvous, learner/ranks.py). Each is made 0700 (`tempfile.mkdtemp`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from liveloop.checkpoint import process_alive

_swept: set[str] = set()  # the kinds this process has swept (at its first directory of each)
_lock = threading.Lock()


def prefix(kind: str, pid: int | None = None) -> str:
    """The name a directory of `kind` made by process `pid` (this one by default) starts with."""
    return f"liveloop-{kind}-{os.getpid() if pid is None else pid}-"


def owned_temp_dir(kind: str) -> Path:
    """A new, empty 0700 directory of this process (the caller removes it when done)."""
    with _lock:
        if kind not in _swept:
            _swept.add(kind)
            sweep(kind)
    return Path(tempfile.mkdtemp(prefix=prefix(kind)))


def sweep(kind: str, root: str | Path | None = None) -> list[Path]:
    """Remove the directories of `kind` under `root` (the temporary directory) whose process is gone."""
    pattern = re.compile(rf"^liveloop-{re.escape(kind)}-(\d+)-")
    stale = []
    with contextlib.suppress(OSError):
        for entry in Path(root or tempfile.gettempdir()).iterdir():
            m = pattern.match(entry.name)
            if m and int(m.group(1)) != os.getpid() and not process_alive(int(m.group(1))) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
                stale.append(entry)
    return stale
