"""Settled reads of what serves. Every change of what serves is two steps: the engine swaps, then the
store records it (or the store records it, then the engine repoints; an undo swaps back). Between them
the engine's view and the store's differ for a moment, and an admin view that shows both (a version
table with the engine's serving version; stats after versions) would contradict itself.

`Changes` marks those windows (`changing`, entered by the publisher and the release gate's candidates
around each engine-then-store or store-then-engine pair, under the publisher's lock, so they never
overlap) and runs reads between them (`settled`): a read waits for a window in progress to close, and
runs again when one opened while it ran. A read never waits for a publish's slow parts (finding and
verifying weights): only for the swap and its transaction. A replica following the store (the store
moved first, on another replica) is not such a window: its engine is behind until it catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class Changes:
    def __init__(self) -> None:
        self._count = 0  # windows opened so far
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

    async def settled(self, read: Callable[[], Awaitable[T]]) -> T:
        """`read()`'s result from a moment when no change was in progress from its start to its end."""
        while True:
            await self._idle.wait()
            seen = self._count
            result = await read()
            if self._idle.is_set() and self._count == seen:
                return result
