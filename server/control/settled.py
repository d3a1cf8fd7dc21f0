"""Settled reads of what serves. Every change of what serves is two steps: the engine swaps, then the
store records it (or the store records it, then the engine repoints; an undo swaps back). Between them
the engine's view and the store's differ for a moment, and an admin view that shows both (a version
table with the engine's serving version; stats after versions) would contradict itself.

`Changes` marks those windows (`changing`, entered by the activator and the release gate's candidates
around each engine-then-store or store-then-engine pair, under the activator's lock, so they never
overlap) and runs reads between them (`settled`): a read waits for a window in progress to close, and
runs again when one opened while it ran. A read never waits for a publish's slow parts (finding and
verifying weights): only for the swap and its transaction. A replica following the store (the store
moved first, on another replica) is not such a window: its engine is behind until it catches up.

Bounded: a read slower than the gaps between windows (a large store's version table at a high swap
rate) would be overlapped every time, and an admin view or the monitor loop would never return. So a
read runs at most `attempts` times (`ATTEMPTS`); when a window overlapped every one, the last result
is returned as it is, marked (`Read.settled` False; `settled` logs it and counts it in `unsettled`),
rather than waited on for ever: at worst it mixes one change's two sides, which the next read shows
resolved. A window cannot be held off from here (it opens under the activator's lock, with no await).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

ATTEMPTS = 4  # reads of one settled read at most: past them, the last result, marked unsettled


@dataclass(frozen=True)
class Read(Generic[T]):
    """A read's result, and whether no change was in progress from its start to its end."""

    value: T
    settled: bool  # False: a change overlapped each of its `attempts`; `value` is the last one's
    attempts: int


class Changes:
    def __init__(self) -> None:
        self._count = 0  # windows opened so far
        self.unsettled = 0  # reads returned unsettled (overlapped `attempts` times)
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """One window in which the engine and the store may disagree on what serves."""
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._idle.set()

    async def idle(self) -> None:
        """Returns when no change is in progress: a synchronous read right after it (no await between)
        is settled."""
        await self._idle.wait()

    async def read(self, read: Callable[[], Awaitable[T]], attempts: int = ATTEMPTS) -> Read[T]:
        """`read()`'s result from a moment when no change was in progress from its start to its end,
        trying at most `attempts` times; past them, the last result, marked unsettled."""
        if attempts < 1:
            raise ValueError(f"a read is tried at least once, not {attempts} times")
        for attempt in range(1, attempts + 1):
            await self._idle.wait()
            seen = self._count
            result = await read()
            if self._idle.is_set() and self._count == seen:
                return Read(result, True, attempt)
        self.unsettled += 1
        return Read(result, False, attempts)

    async def settled(self, read: Callable[[], Awaitable[T]], attempts: int = ATTEMPTS) -> T:
        """`read()`'s result, settled unless changes overlapped each of `attempts` tries (then the
        last one's, logged: see the module docstring)."""
        done = await self.read(read, attempts)
        if not done.settled:
            log.warning("a read overlapped a change of what serves %d times in a row: returned unsettled", done.attempts)
        return done.value
