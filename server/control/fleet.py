"""This replica in the fleet's registry (store/replicas.py): its name (`replica_id`) and its heartbeat,
which registers it and rewrites its row (serving versions, generations running, health) at once when
what it serves changes, looked at every `[server] watch_seconds`, and at least every
`[server] heartbeat_seconds`. A clean stop removes the row (the composition root, liveloop/app.py)."""

from __future__ import annotations

import asyncio
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
    """Register this replica, then rewrite its row whenever `beat()` changes (looked at every
    `look_seconds`), and at least every `write_seconds`; until cancelled. A store that does not answer
    is logged and tried again (the row then ages to "down")."""
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
            elif now_beat != last or now - written >= write_seconds:
                registered = await asyncio.to_thread(registry.beat, name, now_beat)
                last, written = now_beat, now
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("replica heartbeat")
        await asyncio.sleep(look_seconds)
