"""VersionGate: a swap waits for admitted generations, holds new ones back, and every generation
sees exactly one version."""

import asyncio

import pytest

from liveloop.server.engines.base import VersionGate


async def test_swap_waits_for_in_flight_and_blocks_new():
    gate = VersionGate(0)
    events = []
    release = asyncio.Event()

    async def generation(name):
        async with gate.reading() as v:
            events.append((name, "start", v))
            await release.wait()
            events.append((name, "end", v))

    async def apply():
        events.append(("swap", "apply", gate.active))

    g1 = asyncio.create_task(generation("g1"))
    await asyncio.sleep(0.01)
    swap = asyncio.create_task(gate.swap(apply, 1))
    await asyncio.sleep(0.01)
    g2 = asyncio.create_task(generation("g2"))  # arrives while the swap is pending
    await asyncio.sleep(0.01)
    assert not swap.done() and ("g2", "start", 0) not in events and ("g2", "start", 1) not in events
    release.set()
    await asyncio.gather(g1, swap, g2)
    # g1 ran entirely on v0; the swap applied with nothing active; g2 ran entirely on v1
    assert events == [("g1", "start", 0), ("g1", "end", 0), ("swap", "apply", 0), ("g2", "start", 1), ("g2", "end", 1)]
    assert gate.version == 1


async def test_failed_swap_keeps_old_version_and_reopens():
    gate = VersionGate(3)

    async def broken():
        raise RuntimeError("bad checkpoint")

    with pytest.raises(RuntimeError):
        await gate.swap(broken, 4)
    assert gate.version == 3
    async with gate.reading() as v:  # not stuck closed
        assert v == 3
