"""This replica in the fleet's registry (store/replicas.py): its name (`replica_id`) and its heartbeat,
which registers it and rewrites its row (serving versions, generations running, health) at once when
what it serves or its health changes, looked at every `[server] watch_seconds`, and at least every
`[server] heartbeat_seconds`. The generations running are a load gauge, written with the periodic beat
only: under load they change at every look, and a write transaction at each (20 a second on the default
preset, each an fsync on SQLite and a turn at the store's one write lock beside the response writer)
was 3% of the serving process's interpreter time under vLLM's serving benchmark (py-spy). A clean stop
removes the row (the composition root, liveloop/app.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from liveloop.store.replicas import Beat, ReplicaRegistry

log = logging.getLogger(__name__)


@functools.cache
def _process_name() -> str:
    return f"replica-{secrets.token_hex(6)}"


def replica_id(configured: str) -> str:
    """This process's name in the replica registry and in every response's `x-liveloop-replica`:
    `[server] replica_id`, or ("auto") a random name drawn once per process. The name says nothing about
    the machine: its host and pid are in the registry row, which only operators read
    (`/admin/replicas`)."""
    return _process_name() if configured == "auto" else configured


async def heartbeat(
    registry: ReplicaRegistry, name: str, kind: str, beat: Callable[[], Beat], look_seconds: float, write_seconds: float,
) -> None:
    """Register this replica, then rewrite its row whenever what `beat()` says it serves or its health
    changes (looked at every `look_seconds`), and at least every `write_seconds` (the generations running
    with it); until cancelled. A store that does not answer is logged and tried again (the row then ages
    to "down")."""
    last: Beat | None = None
    written = 0.0
    registered = False
    while True:
        try:
            now_beat = beat()
            now = time.monotonic()
            if not registered:
                await asyncio.to_thread(registry.register, name, kind, socket.gethostname(), os.getpid(), now_beat)
                registered, last, written = True, now_beat, now
            elif _serves_otherwise(now_beat, last) or now - written >= write_seconds:
                registered = await asyncio.to_thread(registry.beat, name, now_beat)
                last, written = now_beat, now
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("replica heartbeat")
        await asyncio.sleep(look_seconds)


def _serves_otherwise(beat: Beat, last: Beat | None) -> bool:
    """Whether `beat` differs from `last` in what the replica serves or its health (the generations
    running are left to the periodic beat)."""
    return last is None or dataclasses.replace(beat, in_flight=0) != dataclasses.replace(last, in_flight=0)
