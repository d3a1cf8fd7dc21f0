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


# -- drain deadline: stragglers are ended, the swap proceeds ----------------------------------------


class Straggler:
    """A generation whose client never reads on: it stays admitted until the test lets it exit."""

    def __init__(self, gate: VersionGate):
        self.gate = gate
        self.preempts = 0
        self.admitted = asyncio.Event()
        self.leave = asyncio.Event()
        self.version: int | None = None
        self.task = asyncio.create_task(self._run())

    async def _preempt(self):
        self.preempts += 1

    async def _run(self):
        async with self.gate.reading(self._preempt) as v:
            self.version = v
            self.admitted.set()
            await self.leave.wait()


async def test_swap_ends_a_straggler_at_the_deadline():
    gate = VersionGate(0, drain_deadline=0.05)
    straggler = Straggler(gate)
    await straggler.admitted.wait()
    applied_with = []

    async def apply():
        applied_with.append((straggler.preempts, gate.active))

    held = await asyncio.wait_for(gate.swap(apply, 1), 10)  # returns although the straggler never exits
    assert held >= 0
    # it was ended before the new weights were applied, and no longer counts
    assert applied_with == [(1, 0)]
    assert straggler.preempts == 1 and straggler.version == 0
    assert gate.version == 1 and gate.preempted == 1
    async with gate.reading() as v:  # a new generation is admitted, on the new version
        assert v == 1
    straggler.leave.set()  # its own exit, later, does not corrupt the count
    await straggler.task
    assert gate.active == 0
    assert straggler.preempts == 1


async def test_no_straggler_no_preemption():
    gate = VersionGate(0, drain_deadline=30.0)
    preempts = []
    release = asyncio.Event()

    async def preempt():
        preempts.append(1)

    async def generation():
        async with gate.reading(preempt):
            await release.wait()

    g = asyncio.create_task(generation())
    await asyncio.sleep(0.01)
    swap = asyncio.create_task(gate.swap(lambda: asyncio.sleep(0), 1))
    await asyncio.sleep(0.01)
    assert not swap.done()  # still draining: the deadline is far
    release.set()
    await asyncio.gather(g, swap)
    assert preempts == [] and gate.preempted == 0 and gate.version == 1 and gate.active == 0


async def test_a_reader_without_preempt_callback_is_waited_for():
    gate = VersionGate(0, drain_deadline=0.01)
    release = asyncio.Event()

    async def generation():
        async with gate.reading():
            await release.wait()

    g = asyncio.create_task(generation())
    await asyncio.sleep(0.01)
    swap = asyncio.create_task(gate.swap(lambda: asyncio.sleep(0), 1))
    await asyncio.sleep(0.1)  # well past the deadline
    assert not swap.done() and gate.version == 0
    release.set()
    await asyncio.gather(g, swap)
    assert gate.version == 1 and gate.preempted == 0


async def test_failed_preemption_keeps_old_version_and_reopens():
    gate = VersionGate(2, drain_deadline=0.01)
    release = asyncio.Event()

    async def cannot_stop():
        raise RuntimeError("engine gone")

    async def generation():
        async with gate.reading(cannot_stop):
            await release.wait()

    g = asyncio.create_task(generation())
    await asyncio.sleep(0.01)
    applied = []

    async def apply():
        applied.append(1)

    with pytest.raises(RuntimeError, match="engine gone"):
        await asyncio.wait_for(gate.swap(apply, 3), 10)
    assert applied == [] and gate.version == 2 and gate.active == 1  # still running, still counted
    release.set()
    await g
    async with gate.reading() as v:
        assert v == 2 and gate.active == 1
    assert gate.active == 0


# -- keep swaps: no drain --------------------------------------------------------------------------


async def test_a_keep_swap_does_not_wait_for_running_generations():
    gate = VersionGate(0)
    release = asyncio.Event()
    applied_with = []

    async def generation():
        async with gate.reading() as v:
            await release.wait()
            return v

    async def apply():
        applied_with.append(gate.active)

    running = asyncio.create_task(generation())
    await asyncio.sleep(0.01)
    held = await asyncio.wait_for(gate.swap(apply, 1, drain=False), 1)
    assert applied_with == [1] and gate.version == 1 and held >= 0
    async with gate.reading() as v:  # reopened at once
        assert v == 1
    release.set()
    assert await running == 0  # admitted before the swap: it records its admitted version


async def test_a_keep_swap_admits_new_generations_while_it_applies():
    gate = VersionGate(0)
    applying = asyncio.Event()
    finish_apply = asyncio.Event()

    async def apply():
        applying.set()
        await finish_apply.wait()
        return 0.004  # what the backend's own load held new generations back

    swap = asyncio.create_task(gate.swap(apply, 1, drain=False))
    await applying.wait()
    # never held: admitted under the version serving until the load is done (the backend names the
    # version that samples each of its tokens on the deltas)
    assert await asyncio.wait_for(_admitted_version(gate), 1) == 0
    finish_apply.set()
    assert await swap == 0.004 and gate.version == 1
    assert await _admitted_version(gate) == 1


async def test_keep_swaps_run_one_at_a_time():
    gate = VersionGate(0)
    order = []
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def slow():
        order.append("first starts")
        first_in.set()
        await release.wait()
        order.append("first ends")

    async def fast():
        order.append("second")

    first = asyncio.create_task(gate.swap(slow, 1, drain=False))
    await first_in.wait()
    second = asyncio.create_task(gate.swap(fast, 2, drain=False))
    await asyncio.sleep(0.01)
    assert order == ["first starts"]
    release.set()
    await asyncio.gather(first, second)
    assert order == ["first starts", "first ends", "second"] and gate.version == 2


async def _admitted_version(gate: VersionGate) -> int:
    async with gate.reading() as v:
        return v
