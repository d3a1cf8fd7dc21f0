"""The prompt thread shared fairly between keys (server/edge/pipeline/fair_thread.py): a key's flood
waits its turns behind another key's one job, a key's waiting jobs are bounded, a job whose caller left
before it started never runs, and a job's exception reaches its caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from liveloop.server.edge.admission import Busy
from liveloop.server.edge.pipeline.fair_thread import FairThread


@pytest.fixture
def thread():
    t = FairThread(per_key=8)
    yield t
    t.close()


async def _blocked(thread: FairThread) -> tuple[threading.Event, asyncio.Task]:
    """The thread busy with a job that holds it until the event is set."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(30)

    task = asyncio.create_task(thread.run("holder", hold))
    assert await asyncio.to_thread(started.wait, 30)
    return release, task


async def _queued(thread: FairThread, n: int) -> None:
    """Until `n` jobs wait (bounded: the event loop lets each `run` enqueue)."""
    for _ in range(1000):
        if thread.waiting() >= n:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{thread.waiting()} jobs waiting, expected {n}")


async def test_one_keys_flood_waits_its_turns_behind_another_keys_job(thread):
    release, holder = await _blocked(thread)
    order: list[str] = []
    flood = [asyncio.create_task(thread.run("flood", lambda i=i: order.append(f"flood{i}"))) for i in range(5)]
    await _queued(thread, 5)
    victim = asyncio.create_task(thread.run("victim", lambda: order.append("victim")))
    await _queued(thread, 6)
    release.set()
    await asyncio.gather(holder, victim, *flood)
    assert order == ["flood0", "victim", "flood1", "flood2", "flood3", "flood4"]


async def test_a_keys_waiting_jobs_are_bounded(thread):
    release, holder = await _blocked(thread)
    waiting = [asyncio.create_task(thread.run("k", lambda: None)) for _ in range(8)]
    await _queued(thread, 8)
    with pytest.raises(Busy, match="8 requests waiting"):
        await thread.run("k", lambda: None)
    other = asyncio.create_task(thread.run("other", lambda: "served"))  # another key is not refused
    release.set()
    await asyncio.gather(holder, *waiting)
    assert await other == "served"


async def test_a_job_whose_caller_left_is_skipped(thread):
    release, holder = await _blocked(thread)
    ran: list[str] = []
    gone = asyncio.create_task(thread.run("k", lambda: ran.append("gone")))
    await _queued(thread, 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    release.set()
    await holder
    assert await thread.run("k", lambda: "next") == "next"
    assert ran == [] and thread.skipped == 1


async def test_a_jobs_exception_reaches_its_caller_and_the_thread_goes_on(thread):
    def fail() -> None:
        raise ValueError("bad template")

    with pytest.raises(ValueError, match="bad template"):
        await thread.run("k", fail)
    assert await thread.run("k", lambda: threading.current_thread().name) == "liveloop-prompts"
