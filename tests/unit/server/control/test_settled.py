"""`Changes` (server/control/settled.py): a settled read never spans a change of what serves."""

from __future__ import annotations

import asyncio

from liveloop.server.control.settled import Changes


async def test_a_read_waits_for_the_change_in_progress():
    changes, state = Changes(), {"engine": 1, "store": 1}

    async def change() -> None:
        with changes.changing():
            state["engine"] = 2
            await asyncio.sleep(0.05)  # the store's transaction
            state["store"] = 2

    async def read() -> tuple[int, int]:
        return state["engine"], state["store"]

    task = asyncio.create_task(change())
    await asyncio.sleep(0.01)
    assert await read() == (2, 1)  # torn, unsettled
    assert await changes.settled(read) == (2, 2)
    await task


async def test_a_read_that_a_change_overlapped_runs_again():
    changes, state, reads = Changes(), {"engine": 1, "store": 1}, []

    async def read() -> tuple[int, int]:
        engine = state["engine"]
        reads.append(engine)
        await asyncio.sleep(0.05)  # a slow read: the change begins and ends inside it
        return engine, state["store"]

    async def change() -> None:
        await asyncio.sleep(0.01)
        with changes.changing():
            state["engine"] = 2
            await asyncio.sleep(0.01)
            state["store"] = 2

    task = asyncio.create_task(change())
    assert await changes.settled(read) == (2, 2)
    assert reads == [1, 2]
    await task


async def test_a_change_that_raises_still_ends_its_window():
    changes = Changes()
    try:
        with changes.changing():
            raise RuntimeError("swap failed")
    except RuntimeError:
        pass
    await asyncio.wait_for(changes.idle(), 1)

    async def read() -> int:
        return 7

    assert await asyncio.wait_for(changes.settled(read), 1) == 7
