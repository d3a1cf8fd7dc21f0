"""`Changes` (server/control/settled.py) never stalls: a read slower than the gaps between changes of what
serves, among changes that never stop, returns after a bounded number of attempts, marked unsettled;
a read that fits between two changes is still settled, and once the changes stop a read settles at
its first attempt."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from liveloop.server.control.settled import ATTEMPTS, Changes


@contextlib.asynccontextmanager
async def swapping(changes: Changes, state: dict[str, int]):
    """Windows opened one after another for as long as the block runs: engine first, then the store
    (2 ms), then a 5 ms gap before the next."""
    stop = asyncio.Event()

    async def changer() -> None:
        while not stop.is_set():
            with changes.changing():
                state["engine"] += 1
                await asyncio.sleep(0.002)
                state["store"] += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(changer())
    try:
        yield
    finally:
        stop.set()
        await task


async def test_a_slow_read_among_continuous_changes_returns_in_bounded_attempts():
    changes, state, reads = Changes(), {"engine": 0, "store": 0}, []

    async def read() -> tuple[int, int]:
        reads.append(state["engine"])
        engine = state["engine"]
        await asyncio.sleep(0.03)  # longer than the gap between two windows: overlapped every time
        return engine, state["store"]

    async with swapping(changes, state):
        await asyncio.sleep(0.01)
        await asyncio.wait_for(changes.settled(read), 5)
        assert len(reads) == ATTEMPTS and changes.unsettled == 1

        done = await asyncio.wait_for(changes.read(read, attempts=2), 5)
        assert not done.settled and done.attempts == 2 and len(reads) == ATTEMPTS + 2 and changes.unsettled == 2
        assert len(set(reads)) == len(reads)  # each attempt ran after another change

    done = await changes.read(read)  # the changes stopped: settled at once, both sides agree
    assert done.settled and done.attempts == 1 and done.value[0] == done.value[1]


async def test_a_read_between_two_changes_is_settled_while_they_go_on():
    changes, state = Changes(), {"engine": 0, "store": 0}

    async def read() -> tuple[int, int]:
        return state["engine"], state["store"]  # no await: it fits in any gap

    async with swapping(changes, state):
        for _ in range(20):
            done = await asyncio.wait_for(changes.read(read), 5)
            assert done.settled and done.value[0] == done.value[1]
            await asyncio.sleep(0.003)
    assert changes.unsettled == 0 and state["engine"] > 5


async def test_a_read_is_tried_at_least_once():
    async def read() -> int:
        return 1

    with pytest.raises(ValueError):
        await Changes().read(read, attempts=0)
