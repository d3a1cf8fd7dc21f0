"""Readiness: what runs once at start, before the server answers anything (its /healthz included), so
that the first reply after /healthz says ok is as fast as the second.

- `warm_up(serving, prepare)`: `WARM_UP_REQUESTS` chat generations at once through the serving pipeline as a
  request's (the chat template and the tokenizer on the prompt thread, admission, the engine with the
  sampling every request gets, logprobs included, the text stream), none of them logged (no user sent
  them: they are served as `store: false`). Measured: vLLM compiles its sampler's logprobs kernel
  (`torch.compile` of the rank count in `Sampler.gather_logprobs`) at the first request that asks for
  logprobs, which every liveloop request does: the first reply after a start took 2.6-5.9 s on the
  2-core machine, the second 0.2-0.3 s, and the first benchmark run after a start lost half its
  throughput to it. Several at once, so that batches of one and of several have both been seen. The
  constraint checker's child starts beside them (grammar_check.py), so a first forced call waits for none.
- `freeze_heap()`: once everything has started, the objects the start made (torch, transformers, vLLM,
  the learner's handle: millions) are moved out of the garbage collector's reach (`gc.freeze`, what
  vLLM's own OpenAI server does after its start); otherwise each full collection walks them all while
  it holds the interpreter, a pause of every stream in the process. `thaw_heap()` at the stop gives
  them back.

`WarmUp` is what /healthz's details report (`warm_up`: whether it ran, how long it took, the tokens it
generated) and what `/metrics` carries (`server/warm_up_seconds`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from liveloop.server.edge.principal import Principal

log = logging.getLogger(__name__)

WARM_UP_REQUESTS = 2  # at once: a batch of several, then (as the first ends) of one
WARM_UP_TOKENS = 8
WARM_UP_KEY = "liveloop-warm-up"  # the admission slots' key id (no API key's: 16 hex characters)


@dataclass(frozen=True)
class WarmUp:
    done: bool
    seconds: float = 0.0
    tokens: int = 0
    error: str | None = None

    def details(self) -> dict[str, Any]:
        return {"done": self.done, "seconds": round(self.seconds, 3), "tokens": self.tokens, "error": self.error}


async def warm_up(serving: Any, prepare: Callable[[str, Principal, int], Awaitable[Any]], requests: int = WARM_UP_REQUESTS,
                  max_tokens: int = WARM_UP_TOKENS) -> WarmUp:
    """Generate `requests` short chat replies at once through `serving` (server/edge/pipeline/serving.py),
    nothing logged; `prepare(text, principal, max_tokens)` makes each one's prepared request (the chat
    endpoint's, handed in by the composition root). A failure is reported, not raised: a server whose
    engine cannot generate is unhealthy by its own check, and the warm-up only saves its first user the
    wait."""
    principal = Principal(key_id=WARM_UP_KEY, admin=False, unstored=True)
    started = time.perf_counter()
    try:
        await asyncio.to_thread(serving.prompter.start_checker)
    except Exception:  # noqa: BLE001 - its first constrained request makes it again, and says why
        log.exception("the constraint checker did not start")

    async def one(i: int) -> int:
        prepared = await prepare(f"Say something about the number {i}.", principal, max_tokens)
        async with serving.runs(serving.choices(prepared, 1)) as runs:
            async for _ in runs[0]:
                pass
            return len(runs[0].token_ids)

    try:
        tokens = sum(await asyncio.gather(*(one(i) for i in range(requests))))
    except Exception as exc:  # noqa: BLE001 - reported in /healthz and the log; serving goes on
        log.exception("warm-up generation failed")
        return WarmUp(False, time.perf_counter() - started, 0, f"{type(exc).__name__}: {exc}")
    result = WarmUp(True, time.perf_counter() - started, tokens)
    serving.metrics.set("server/warm_up_seconds", result.seconds)
    log.info("warm-up: %d generations, %d tokens in %.2f s", requests, tokens, result.seconds)
    return result


def freeze_heap() -> None:
    """Collect what the start left, then keep every object alive now out of later collections."""
    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """At the stop: the frozen objects are the collector's again (a process that builds another app, a
    test run, frees what the stopped one held in cycles)."""
    gc.unfreeze()
