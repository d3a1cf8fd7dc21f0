"""How the threaded engines' worker hands deltas to the event loop (server/engines/threaded.py): one
call into each loop for a whole hand-over, each stream's deltas in order, consecutive ones merged
unless one ended the stream, they came from two versions, or one is an error."""

from __future__ import annotations

import asyncio
import threading

from liveloop.server.engines.base import TokenDelta
from liveloop.server.engines.threaded import _Held, _hand_over


def _d(*ids: int, version: int | None = None, finish: str | None = None) -> TokenDelta:
    return TokenDelta(list(ids), [-0.5 * i for i in ids], None, finish, version)


async def _handed(held_by_stream: list[tuple[int, TokenDelta | BaseException]], streams: int) -> list[list]:
    loop = asyncio.get_running_loop()
    outs = [asyncio.Queue() for _ in range(streams)]
    calls = 0
    original = loop.call_soon_threadsafe

    def counted(*args):
        nonlocal calls
        calls += 1
        return original(*args)

    loop.call_soon_threadsafe = counted
    try:
        held = [_Held(loop, outs[s], item, False) for s, item in held_by_stream]
        worker = threading.Thread(target=_hand_over, args=(held,))  # the worker thread hands over
        worker.start()
        worker.join()
        await asyncio.sleep(0)
    finally:
        del loop.call_soon_threadsafe
    assert calls == 1
    return [[q.get_nowait() for _ in range(q.qsize())] for q in outs]


async def test_a_streams_consecutive_deltas_become_one_in_order():
    a, b = await _handed([(0, _d(1)), (1, _d(7)), (0, _d(2, 3)), (1, _d(8)), (0, _d(4, finish="length"))], 2)
    assert len(a) == 1 and a[0].token_ids == [1, 2, 3, 4] and a[0].logprobs == [-0.5, -1.0, -1.5, -2.0]
    assert a[0].finish_reason == "length"
    assert len(b) == 1 and b[0].token_ids == [7, 8] and b[0].finish_reason is None


async def test_two_versions_an_ended_stream_and_an_error_stay_apart():
    error = RuntimeError("engine broke")
    (out,) = await _handed([(0, _d(1, version=1)), (0, _d(2, version=2)), (0, _d(3, version=2, finish="stop")),
                            (0, _d(4, version=2)), (0, error), (0, _d(5, version=2))], 1)
    assert [d.token_ids if isinstance(d, TokenDelta) else d for d in out] == [[1], [2, 3], [4], error, [5]]
    assert [d.version for d in out if isinstance(d, TokenDelta)] == [1, 2, 2, 2]


async def test_top_logprobs_are_merged_with_their_tokens():
    first = TokenDelta([1], [-0.1], [[(1, -0.1)]])
    second = TokenDelta([2], [-0.2], [[(2, -0.2)]], "stop")
    (out,) = await _handed([(0, first), (0, second)], 1)
    assert out[0].top_logprobs == [[(1, -0.1)], [(2, -0.2)]] and out[0].token_ids == [1, 2]
