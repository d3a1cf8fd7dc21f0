"""The shared_memory transport's bell: a co-located learner's word to the servers on its machine that a
version's memory is finished, so a server's version watcher looks at once instead of at its next poll.

    /dev/shm/liveloop-<uid>/<namespace>/bell-<12 hex>.sock     one per server process (AF_UNIX, SOCK_DGRAM; a short
                                                               name: a socket's path has at most 107 bytes)

A server binds its `Bell` in the deployment's private directory (0700: only this user reaches it) and
waits on it (`Bell.wait(timeout)`: the version numbers rung meanwhile, or [] when the timeout passed).
`ring(namespace, version)`, called by the sender once a version's manifest is finished, sends the number
to every bell there without blocking; a bell nobody listens at any more (a killed server's) refuses it
and is removed. A ring is a hint, never an instruction: the watcher still asks the store what was
published (the version's row, written after its memory, names the digest the memory is verified
against), and a lost ring only means the next poll finds the version. Nothing here can fail a publish.

The vLLM engine uses the same bell, in a private directory of its own, for its worker's word that a
swap's weights are staged (server/engines/vllm/staging.py rings the status as JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NAME = re.compile(r"bell-[0-9a-f]{12}\.sock")
_MAX_RUNG = 64  # datagrams read per wake (a ring is a few bytes; more would be a flood: drained anyway)
_MAX_MESSAGE = 4096


class Bell:
    """A server's bell in `folder` (the namespace's private directory), bound now; `close` removes it."""

    def __init__(self, folder: Path):
        self.path = folder / f"bell-{secrets.token_hex(6)}.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setblocking(False)
            self._sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
        except BaseException:
            self.close()
            raise

    def rung(self, parse: Callable[[bytes], Any] = int) -> list[Any]:
        """What was rung since the last look, each message `parse`d (the versions, by default; one that
        does not parse is dropped). Never blocks."""
        out = []
        for _ in range(_MAX_RUNG):
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except (BlockingIOError, OSError):
                break
            with contextlib.suppress(ValueError):
                out.append(parse(data))
        return out

    async def wait(self, timeout: float, parse: Callable[[bytes], Any] = int) -> list[Any]:
        """What was rung before `timeout` seconds pass (at once if something was rung already), else []."""
        got = self.rung(parse)
        if got or timeout <= 0:
            return got
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
        return self.rung(parse)

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def ring(folder: Path, message: int | str) -> int:
    """Ring every bell in `folder` with `message` (a version whose memory is finished; any short text);
    how many heard it. A bell nobody is bound to any more is removed; nothing raises."""
    heard = 0
    try:
        names = [n for n in os.listdir(folder) if NAME.fullmatch(n)]
    except OSError:
        return 0
    if not names:
        return 0
    uid = os.getuid()
    payload = str(message).encode()[:_MAX_MESSAGE]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for name in names:
            path = folder / name
            try:
                st = os.lstat(path)
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
                    continue
                sock.sendto(payload, str(path))
                heard += 1
            except (ConnectionRefusedError, FileNotFoundError):  # its server is gone
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except OSError:  # its queue is full: that server is awake already
                heard += 1
    return heard
