"""The lifetime of one generating request, shared by every generating endpoint (OpenAI chat and
completions, Anthropic messages): `EndpointServing.handle` parses, prepares and admits the request,
then answers it whole or as a server-sent-event stream, in the endpoint's own format (a `Format`: the
whole body, a stream's opening, text groups, error event and closing). The routes only dispatch.

Every response carries its `id` (the key for feedback) and the policy version it was admitted at, in
the body and in the header `x-liveloop-policy-version` (the header goes out before the first token,
so it can only ever name the admitted version). A response (or the last event of a stream) is sent
only after the response is durably logged.

While a response is generated its id and key are in `Generating` (the edge's, server/edge/dependencies.py), so that
DELETE /v1/responses/{id} can answer for a response whose row has not landed yet (its tombstone keeps
the row out, store/rights.py). A forgotten key served under `[auth] forgotten_keys = "unstored"`
(`Principal.unstored`) is served as if it had sent `store: false`; under `[server] store_false =
"tokens"` a `store: false` request is logged for training without its text (`tokens_only`).

Streaming costs a write (a system call, a wake-up of the client) per event: a stream writes the first
token at once, then what arrived since its last write at most every `Serving.stream_interval` seconds;
the opening events go out with the first token, the last events in one write. A client that
disconnects stops the generation (whole responses watch the connection; a stream's write fails), and
the admitted generation is released however the response ends (`_ReleasingStream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from liveloop.server.edge.principal import Principal
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import domain_error
from liveloop.server.edge.pipeline.serving import Piece, Prepared, Run, Serving
from liveloop.server.edge.sessions import Asked, read_session

log = logging.getLogger(__name__)
VERSION_HEADER = "x-liveloop-policy-version"
MAX_UNSENT = 16  # pieces a stream reads ahead of its client (see `_gathered`)


class Generating:
    """The responses this process is generating: id -> the key it is for (event-loop only)."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    @contextlib.contextmanager
    def holding(self, choices: list[Prepared]) -> Iterator[None]:
        """Mark a request's responses as generating, for the key they are for, until the block ends."""
        for p in choices:
            self._owners[p.response_id] = p.principal.key_id
        try:
            yield
        finally:
            for p in choices:
                self._owners.pop(p.response_id, None)

    def owner(self, response_id: str) -> str | None:
        return self._owners.get(response_id)


INLINE_ENTRIES = 4096  # a whole response of more sampled tokens and alternatives than this is built off the loop


def _entries(runs: list[Run]) -> int:
    """The tokens and top-logprob alternatives a whole response's body lists (what its size grows with)."""
    return sum(len(r.token_ids) + sum(len(alts) for alts in r.top_logprobs) for r in runs)


def json_text(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def spans(run: Run) -> list[dict[str, int]]:
    """The response's `version_spans` as the API shows them."""
    return [{"start": a, "end": b, "version": v} for a, b, v in run.spans.all()]


class Format:
    """The bodies of one endpoint for one request (all its choices): `whole` (the complete response of
    every run), and a stream's bytes: `opening` (sent with the first text), `group` (one run's text
    pieces of one write; b"" sends nothing), `settle` (a run's generation ended: what it held back,
    and its reply read as a message, `Run.parsed`), `error` (a failure after the status went out) and
    `closing` (after every run is logged)."""

    wants_tokens = False  # a group needs the pieces' tokens, not only their text

    def whole(self, runs: list[Run]) -> dict:
        raise NotImplementedError

    def opening(self, runs: list[Run]) -> bytes:
        return b""

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        raise NotImplementedError

    def settle(self, run: Run) -> bytes:
        run.message()
        return b""

    def error(self, status: int, message: str, code: str | None) -> bytes:
        raise NotImplementedError

    def closing(self, runs: list[Run]) -> bytes:
        raise NotImplementedError

    def headers(self, runs: list[Run]) -> dict[str, str]:
        return {VERSION_HEADER: str(runs[0].version)}


def tokens_only(prepared: Prepared) -> Prepared:
    """A `store: false` request under `[server] store_false = "tokens"`: logged like any response (its
    tokens, logprobs, versions and episode links: it is rated and trained on), its conversation text not
    kept (the store's conversation reads skip a row without messages, so no API reads it back)."""
    return dataclasses.replace(prepared, store=True, messages=None, options=None)


class EndpointServing:
    """One generating endpoint, built once (the composition root hands it what it uses): its request
    model, its rate bucket, how its request is prepared (`prepare`, with what `load`
    read) and its `Format`. `handle` serves one request."""

    request_model: ClassVar[type]
    rate_bucket: ClassVar[str] = "chat"

    def __init__(self, serving: Serving, generating: Generating):
        self.serving = serving
        self.generating = generating

    def format(self, req: Any, prepared: Prepared) -> Format:
        raise NotImplementedError

    async def load(self, req: Any, principal: Principal) -> Any:
        """What `prepare` needs from elsewhere, read on the event loop's terms (an endpoint that reads
        the store reads it here, off the prompt thread); handed to `prepare`."""
        return None

    def prepare(self, req: Any, principal: Principal, loaded: Any) -> Prepared:
        """On the prompt thread: the request rendered and checked (each endpoint's own)."""
        raise NotImplementedError

    async def handle(self, request: Request, principal: Principal) -> Response:
        serving = self.serving
        serving.admission.check_rate(self.rate_bucket, principal.key_id)  # raises RateLimited (429)
        req = await parse_body(request, self.request_model)
        loaded = await self.load(req, principal)
        # length-checked on the loop, rendered and tokenized off it
        prepared = await serving.prepare(req, principal, lambda r, p: self.prepare(r, p, loaded))
        prepared = dataclasses.replace(prepared, session=read_session(request.headers, Asked.of_request(req)))  # its episode
        if principal.unstored:  # a forgotten key under `forgotten_keys = "unstored"`: nothing of it is logged
            prepared = dataclasses.replace(prepared, store=False)
        elif not prepared.store and serving.server.store_false == "tokens":
            prepared = tokens_only(prepared)
        choices = serving.choices(prepared, getattr(req, "n", 1))
        fmt = self.format(req, prepared)
        if req.stream:
            return await self._stream(choices, fmt)
        with self.generating.holding(choices):
            return await self._complete(request, choices, fmt)

    async def _complete(self, request: Request, choices: list[Prepared], fmt: Format) -> Response:
        """A whole response. A client that disconnects meanwhile stops the generations (as a stream's does):
        leaving each run aborts its engine request and logs what was generated, finish_reason "abort"."""
        async with self.serving.runs(choices) as runs:  # raises Busy: nothing started
            if not await _unless_disconnected(request, _drain(runs)):
                log.info("client of %s went away: generation stopped", choices[0].response_id)
                return Response(status_code=499)  # nobody reads it
            await _commit(self.serving, runs)
            if _entries(runs) <= INLINE_ENTRIES:
                return JSONResponse(fmt.whole(runs), headers=fmt.headers(runs))
            # n choices of per-token top logprobs: the body is built and encoded on the prompt thread
            # (the tokenizer's one user), never on the event loop every other request shares
            return await self.serving.on_prompt_thread(lambda: JSONResponse(fmt.whole(runs), headers=fmt.headers(runs)),
                                                       choices[0].principal.key_id)

    async def _stream(self, choices: list[Prepared], fmt: Format) -> StreamingResponse:
        serving = self.serving
        stack = contextlib.AsyncExitStack()
        try:
            stack.enter_context(self.generating.holding(choices))
            runs = await stack.enter_async_context(serving.runs(choices))  # admitted: the version goes out in the header
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        closed = False

        async def release() -> None:
            nonlocal closed
            if not closed:
                closed = True
                with anyio.CancelScope(shield=True):  # a vanished client's cancellation must not cut the clean-up short
                    await stack.aclose()

        async def events() -> AsyncIterator[bytes]:
            try:
                opening = fmt.opening(runs)  # rides with the first write that has more (the headers went out)
                try:
                    # closed here, not by the garbage collector: its readers must stop before `release`
                    async with contextlib.aclosing(_merged(runs, serving.stream_interval)) as groups:
                        async for run, pieces in groups:
                            out = fmt.group(run, pieces) if pieces is not None else fmt.settle(run)
                            if out:
                                yield opening + out
                                opening = b""
                except Exception:  # the engine failed mid-stream: the status is sent, so say it in the stream
                    log.exception("generation %s failed", choices[0].response_id)
                    yield opening + fmt.error(500, "the generation failed", "generation_failed")
                    return
                try:
                    await _commit(serving, runs)
                except Exception as exc:  # the store refused or is full: say so in the stream (the status is sent)
                    mapped = domain_error(exc)
                    if mapped is None:
                        raise
                    yield opening + fmt.error(mapped.status, mapped.message, mapped.code)
                    return
                yield opening + fmt.closing(runs)
            finally:
                await release()

        return _ReleasingStream(
            events(),
            release,
            media_type="text/event-stream",
            headers={**fmt.headers(runs), "cache-control": "no-cache"},
        )


async def _commit(serving: Serving, runs: list[Run]) -> None:
    """Log every run durably (one commit for one run; the choices of one request together)."""
    if len(runs) == 1:
        await serving.commit(runs[0])
    else:
        await asyncio.gather(*(serving.commit(r) for r in runs))


async def _merged(runs: list[Run], interval: float) -> AsyncIterator[tuple[Run, list[Piece] | None]]:
    """Every run's pieces in groups as `_gathered` makes them, interleaved as they come, each run's
    end marked by (run, None). One run: its groups directly."""
    if len(runs) == 1:
        async with contextlib.aclosing(_gathered(runs[0], interval)) as groups:
            async for group in groups:
                yield runs[0], group
        yield runs[0], None
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(run: Run) -> None:
        try:
            async with contextlib.aclosing(_gathered(run, interval)) as groups:
                async for group in groups:
                    await queue.put((run, group))
            await queue.put((run, None))
        except Exception as exc:
            await queue.put((run, exc))

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(pump(r)) for r in runs]
    try:
        ended = 0
        while ended < len(runs):
            run, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                ended += 1
            yield run, item
    finally:
        for t in tasks:
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _drain(runs: list[Run]) -> None:
    """Generate every run to its end (the choices of one request side by side)."""

    async def one(run: Run) -> None:
        async for _ in run:
            pass

    if len(runs) == 1:
        await one(runs[0])
    else:
        await asyncio.gather(*(one(r) for r in runs))


async def _unless_disconnected(request: Request, work: Any) -> bool:
    """Run `work` (a coroutine) while watching the connection: True when it finished; False when the
    client disconnected first (then `work` is cancelled). Its failure is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # raises the generation's failure
    return True


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _gathered(pieces: AsyncIterator[Piece], interval: float) -> AsyncIterator[list[Piece]]:
    """The pieces of a generation in groups, each group one write to the client: the first piece at
    once (the time to first token does not change), then whatever arrived since the last write, no
    sooner than `interval` seconds after it, and the end at once. Every write is a system call and a
    wake-up of the client, per token without grouping; 0 writes each piece as it comes.

    A client that stops reading still holds the generation back: with `MAX_UNSENT` pieces waiting the
    reader stops taking more, as a blocked write did before (a swap's drain deadline then ends it)."""
    if interval <= 0:
        async for piece in pieces:
            yield [piece]
        return
    buffer: list[Piece] = []
    arrived, finished, room = asyncio.Event(), asyncio.Event(), asyncio.Event()
    failure: list[Exception] = []  # reading the pieces failed: raised after the pieces read before it

    async def pump() -> None:
        try:
            async for piece in pieces:
                buffer.append(piece)
                arrived.set()
                while len(buffer) >= MAX_UNSENT:
                    room.clear()
                    await room.wait()
        except Exception as exc:
            failure.append(exc)
        except asyncio.CancelledError:  # by the writer's clean-up, or else a failure of the generation
            failure.append(RuntimeError("reading the generation was cancelled"))
            raise
        finally:  # the writer never waits for a reader that is gone
            finished.set()
            arrived.set()

    reader = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            await arrived.wait()
            arrived.clear()
            if buffer:
                group, buffer[:] = list(buffer), []
                room.set()
                yield group
            if finished.is_set() and not buffer:
                if failure:
                    raise failure[0]
                return
            with contextlib.suppress(TimeoutError):  # the interval passes, or the generation ends first
                async with asyncio.timeout(interval):
                    await finished.wait()
    finally:
        if not reader.done():
            reader.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(reader, return_exceptions=True)


class _ReleasingStream(StreamingResponse):
    """Releases the admitted generation however the response ends, even if the client disconnects
    before the body starts (then the body generator never runs its own `finally`). A body left
    suspended at a write is closed first, so the reader of its pieces stops before the release
    closes them."""

    def __init__(self, content: AsyncIterator[bytes], release: Any, **kw: Any):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
            await self._release()
