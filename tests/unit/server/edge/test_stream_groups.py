"""How a stream groups its pieces into writes (`streaming._gathered`): the first piece at once,
later ones together at most once per interval, the end at once, a failure after what came before
it, and a reader that stops taking pieces while the client does not read."""

import asyncio
import time

import pytest

from liveloop.server.edge.pipeline.streaming import MAX_UNSENT, _gathered
from liveloop.server.edge.pipeline.serving import Piece


def _piece(i: int) -> Piece:
    return Piece(str(i), [i], [0.0], None, 0)


async def _paced(n: int, gap: float, fail: bool = False):
    for i in range(n):
        yield _piece(i)
        await asyncio.sleep(gap)
    if fail:
        raise RuntimeError("engine died")


def test_first_piece_at_once_then_grouped_and_nothing_lost():
    async def go():
        start, groups, times = time.monotonic(), [], []
        async for group in _gathered(_paced(20, 0.005), 0.03):
            groups.append([p.text for p in group])
            times.append(time.monotonic() - start)
        return groups, times

    groups, times = asyncio.run(go())
    assert groups[0] == ["0"] and times[0] < 0.02  # the first token is not held back
    assert [t for g in groups for t in g] == [str(i) for i in range(20)]
    assert len(groups) < 20 / 2  # ~6 pieces per 30 ms write, not a write per piece


def test_interval_zero_writes_each_piece():
    async def go():
        return [len(g) async for g in _gathered(_paced(5, 0.0), 0.0)]

    assert asyncio.run(go()) == [1] * 5


def test_a_failure_comes_after_the_pieces_before_it():
    async def go():
        seen = []
        with pytest.raises(RuntimeError, match="engine died"):
            async for group in _gathered(_paced(3, 0.001, fail=True), 0.01):
                seen += [p.text for p in group]
        return seen

    assert asyncio.run(go()) == ["0", "1", "2"]


def test_a_client_that_does_not_read_holds_the_reader_back():
    taken = []

    async def endless():
        for i in range(10_000):
            taken.append(i)
            yield _piece(i)
            await asyncio.sleep(0)

    async def go():
        groups = _gathered(endless(), 0.01)
        await groups.__anext__()  # one write, then the client stalls
        await asyncio.sleep(0.1)
        stalled_at = len(taken)
        await groups.aclose()  # the reader is stopped, not left running
        await asyncio.sleep(0.05)
        return stalled_at, len(taken)

    stalled_at, after_close = asyncio.run(go())
    assert stalled_at <= 1 + MAX_UNSENT + 1
    assert after_close == stalled_at
