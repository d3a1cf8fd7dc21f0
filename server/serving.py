"""The serving pipeline between the HTTP edge and the engine: request -> prompt token ids and
sampling params (with every limit checked before anything runs), an admitted generation whose
version is known before the first byte goes out, text and stop strings, and the durable log record.

    prepared = await serving.prepare(request, principal)     # raises InvalidRequest / UnknownModel on bad input
    async with serving.run(prepared) as run:                  # admitted (a generation slot, the engine's gate): run.version
        async for piece in run: ...                           # text + tokens as they arrive
        await serving.commit(run)                             # durable in the store; then reply

Nothing a request sends can hold the event loop: its text is bounded in characters
(`[server] max_prompt_chars`, by default 32 per token of the model's context) before the chat template
runs, and templating and tokenizing run on one worker thread, off the loop. A commit waits for the
store at most `[store] write_deadline_seconds` (then LogFailed: a 503 with Retry-After at the edge).

However the caller ends (finished, failed, its client gone, its task cancelled), leaving `run` stops the
engine request, releases the slot and the gate, and logs a response that was not committed yet, once:
that clean-up runs shielded from cancellation, so a vanished client can neither lose its record nor
leave the engine's gate held. A request with `store: false` is served and never logged.

Which version sampled which tokens: a `keep` swap lets a running generation continue under new
weights, and each engine delta names the version that sampled it. `VersionSpans` folds those into
(start, end, version) spans over the response's token indexes, which the record stores (None when
all of it came from the admitted version) and the API shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from liveloop.metrics import Metrics
from liveloop.release.routing import user_key
from liveloop.server.admission import Admission
from liveloop.server.auth import Principal
from liveloop.server.config import EngineConfig, ServerConfig
from liveloop.server.engines.base import Engine, GenerationRequest, SamplingParams, TokenDelta
from liveloop.server.schemas import ChatCompletionRequest, CompletionRequest, MessagesRequest
from liveloop.server.text import TextStream
from liveloop.store import BatchWriter, ResponseRecord, WriterDown, WriterFull
from liveloop.store.writer import WriterSlow

log = logging.getLogger(__name__)
GREEDY_BELOW = 1e-5
CHARS_PER_TOKEN = 32  # `max_prompt_chars` 0: this many characters per token of context (a real text has ~4)
# a stream writes the first token at once, then at most one write per this many seconds (what arrived
# meanwhile goes out together): a write per token costs a system call and a client wake-up per token


class InvalidRequest(ValueError):
    """A request the model cannot serve as asked (empty prompt, out-of-vocabulary ids, too long for the
    context, more tokens than allowed); `param` names the offending field."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class UnknownModel(LookupError):
    """The request names a model this server does not serve."""

    def __init__(self, model: str):
        super().__init__(f"the model `{model}` does not exist")
        self.model = model


class LogFailed(RuntimeError):
    """The store did not take a write (it refused it, or did not commit it within the deadline): the
    client must not be told it is complete."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after

    @classmethod
    def too_slow(cls, exc: WriterSlow) -> "LogFailed":
        return cls(f"{exc}; please retry", retry_after=exc.retry_after)


@dataclass(frozen=True)
class Prepared:
    response_id: str
    endpoint: str  # "chat" | "completion" | "messages"
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    stops: list[str]
    principal: Principal
    meta: dict[str, str] | None
    created: int
    store: bool = True  # False: serve, never log (OpenAI's `store: false`)
    segment: str | None = None  # the adapter segment that serves it (None: adapters are off)
    user: str = ""  # who it is routed by for a canary: its `user` field, else its API key (release/routing.py)


Span = tuple[int, int, int]  # (start, end, version) over response token indexes [start, end)


class VersionSpans:
    """Accumulates which version sampled which response tokens, delta by delta, merging neighbours
    of the same version. Deltas without tokens add nothing."""

    def __init__(self, admitted: int):
        self.admitted = admitted
        self.spans: list[list[int]] = []
        self.length = 0

    def add(self, n_tokens: int, version: int | None) -> int:
        """n new tokens sampled by `version` (None: the admitted one); returns that version."""
        v = self.admitted if version is None else version
        if n_tokens:
            if self.spans and self.spans[-1][2] == v:
                self.spans[-1][1] += n_tokens
            else:
                self.spans.append([self.length, self.length + n_tokens, v])
            self.length += n_tokens
        return v

    def all(self) -> tuple[Span, ...]:
        """Every span, in order (one when no swap happened; none for an empty response)."""
        return tuple((a, b, v) for a, b, v in self.spans)

    def record(self) -> tuple[Span, ...] | None:
        """What the store keeps: None when every token came from the admitted version."""
        if all(v == self.admitted for _, _, v in self.spans):
            return None
        return self.all()


def version_spans(deltas: Iterable[TokenDelta], admitted: int) -> tuple[Span, ...]:
    """The spans a generation admitted at `admitted` produced through these deltas."""
    spans = VersionSpans(admitted)
    for delta in deltas:
        spans.add(len(delta.token_ids), delta.version)
    return spans.all()


@dataclass
class Piece:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    version: int  # the version that sampled these tokens


@dataclass
class Run:
    prepared: Prepared
    version: int
    stream: AsyncIterator[Piece]
    segment: str | None = None  # recorded with the response: the segment it was routed to
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    ended: float | None = None
    committed: bool = False
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop")
    spans: VersionSpans = field(init=False)

    def __post_init__(self) -> None:
        self.spans = VersionSpans(self.version)

    def __aiter__(self) -> AsyncIterator[Piece]:
        return self.stream


def _stop_ids(tokenizer: Any, model_dir: Path) -> tuple[int, ...]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.exists():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return tuple(sorted(ids))


class Serving:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        writer: BatchWriter,
        metrics: Metrics,
        server: ServerConfig,
        engine_config: EngineConfig,
        model_dir: Path,
        admission: Admission | None = None,
        route: Callable[[Mapping[str, Any] | None], str | None] | None = None,
        canary: Callable[[str, str | None], bool] | None = None,
    ):
        self.engine = engine
        # (user, segment) -> whether a canary candidate serves the request (the release gate's rule; None: never)
        self.canary = canary or (lambda user, segment: False)
        self.route = route or (lambda meta: None)  # request metadata -> adapter segment (liveloop/segments.py)
        self.admission = admission or Admission(server)
        self.tokenizer = tokenizer
        self.writer = writer
        self.metrics = metrics
        self.server = server
        self.model_name = engine_config.served_model_name
        self.max_model_len = engine_config.max_model_len
        self.stop_token_ids = _stop_ids(tokenizer, model_dir)
        self.vocab_size = len(tokenizer)
        self.max_prompt_chars = server.max_prompt_chars or CHARS_PER_TOKEN * self.max_model_len
        # templating and tokenizing, off the loop: one thread, so no two encodes of the tokenizer run at once
        self._prompts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="liveloop-prompts")
        self.stream_interval = server.stream_interval_ms / 1000  # seconds between a stream's writes (0: a write per delta)

    # -- 1. request -> prompt ids + sampling --------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise UnknownModel(model)

    async def prepare(self, req: ChatCompletionRequest | CompletionRequest | MessagesRequest, principal: Principal) -> Prepared:
        """`prepare_chat` / `prepare_completion` with the text's length checked here, before anything is
        rendered, and the rendering and tokenizing on the prompt thread: the event loop never does either."""
        self._check_model(req.model)
        self.check_chars(req)
        if isinstance(req, ChatCompletionRequest):
            work = self.prepare_chat
        elif isinstance(req, MessagesRequest):
            work = self.prepare_messages
        else:
            work = self.prepare_completion
        return await asyncio.get_running_loop().run_in_executor(self._prompts, work, req, principal)

    def check_chars(self, req: ChatCompletionRequest | CompletionRequest | MessagesRequest) -> None:
        """Refuse a text longer than `max_prompt_chars` (a cheap bound: the context holds fewer tokens
        than that), before the chat template or the tokenizer sees it."""
        if isinstance(req, ChatCompletionRequest):
            n, param = sum(len(m.text()) for m in req.messages), "messages"
        elif isinstance(req, MessagesRequest):
            n, param = len(req.system_text()) + sum(len(m.text()) for m in req.messages), "messages"
        elif isinstance(req.prompt, str):
            n, param = len(req.prompt), "prompt"
        else:
            return
        if n > self.max_prompt_chars:
            raise InvalidRequest(
                f"this model's maximum context length is {self.max_model_len} tokens; the text has {n} characters "
                f"(at most {self.max_prompt_chars} are taken)",
                param,
                code="context_length_exceeded",
            )

    def close(self) -> None:
        self._prompts.shutdown(wait=False, cancel_futures=True)

    def prepare_chat(self, req: ChatCompletionRequest, principal: Principal) -> Prepared:
        self._check_model(req.model)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        prompt_ids = self._chat_prompt(messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
        top = (req.top_logprobs or 0) if req.logprobs else 0
        return self._prepared("chat", "chatcmpl", prompt_ids, max_tokens, top, req, principal, req.metadata, req.user)

    def prepare_messages(self, req: MessagesRequest, principal: Principal) -> Prepared:
        """Anthropic messages: the system prompt first, then the turns, through the same chat template;
        `metadata.user_id` is who the canary routes by (as chat's `user`), and no segment tags."""
        self._check_model(req.model)
        system = req.system_text()
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m.role, "content": m.text()} for m in req.messages
        ]
        prompt_ids = self._chat_prompt(messages)
        return self._prepared("messages", "msg", prompt_ids, req.max_tokens, 0, req, principal, None, req.user())

    def _chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise InvalidRequest("this model has no chat template: use /v1/completions", "messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template refuses this conversation (its roles' order, say): the request's fault
            raise InvalidRequest(f"messages: the model's chat template refused them: {str(exc)[:200]}", "messages") from exc
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prepare_completion(self, req: CompletionRequest, principal: Principal) -> Prepared:
        self._check_model(req.model)
        if isinstance(req.prompt, str):
            prompt_ids = self.tokenizer(req.prompt, add_special_tokens=True)["input_ids"]
        else:
            prompt_ids = list(req.prompt)
            if max(prompt_ids) >= self.vocab_size:
                raise InvalidRequest(f"prompt: token ids must be < {self.vocab_size}", "prompt")
        return self._prepared("completion", "cmpl", prompt_ids, req.max_tokens, req.logprobs or 0, req, principal, req.metadata, req.user)

    def _prepared(self, endpoint, prefix, prompt_ids, max_tokens, top, req, principal, meta, user) -> Prepared:
        n_prompt = len(prompt_ids)
        if n_prompt == 0:
            raise InvalidRequest("the prompt is empty", "prompt")
        if n_prompt >= self.max_model_len:
            raise InvalidRequest(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has {n_prompt}",
                "prompt" if endpoint == "completion" else "messages",
                code="context_length_exceeded",
            )
        room = self.max_model_len - n_prompt
        if max_tokens is None:
            max_tokens = min(self.server.default_max_tokens, room)
        elif max_tokens > self.server.max_tokens_limit:
            raise InvalidRequest(f"max_tokens: at most {self.server.max_tokens_limit}", "max_tokens")
        elif max_tokens > room:
            raise InvalidRequest(
                f"this model's maximum context length is {self.max_model_len} tokens: {n_prompt} in the prompt "
                f"+ {max_tokens} max_tokens is too many",
                "max_tokens",
                code="context_length_exceeded",
            )
        sampling = SamplingParams(
            max_tokens=max_tokens,
            # below vLLM's sampling epsilon a temperature is greedy on every engine (logits / 1e-300 overflow)
            temperature=0.0 if req.temperature < GREEDY_BELOW else req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            top_logprobs=top,
            stop_token_ids=self.stop_token_ids,
        )
        return Prepared(
            response_id=f"{prefix}_{uuid.uuid4().hex}" if prefix == "msg" else f"{prefix}-{uuid.uuid4().hex}",
            endpoint=endpoint,
            prompt_ids=tuple(prompt_ids),
            sampling=sampling,
            stops=req.stops(),
            principal=principal,
            meta=dict(meta) if meta else None,
            created=int(time.time()),
            store=req.store,
            segment=self.route(meta),
            user=user_key(user, principal.key_id),
        )

    # -- 2. admitted generation -> pieces ------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def run(self, prepared: Prepared) -> AsyncIterator[Run]:
        with self.admission.generation(prepared.principal.key_id):  # raises Busy: nothing started
            canary = self.canary(prepared.user, prepared.segment)  # decided at admission: the candidate may change
            request = GenerationRequest(prepared.response_id, prepared.prompt_ids, prepared.sampling, prepared.segment, canary)
            admitted = self.engine.generate(request)
            gen = await admitted.__aenter__()
            run = Run(prepared, gen.version, None, prepared.segment)  # type: ignore[arg-type]
            run.stream = self._pieces(run, gen)
            try:
                yield run
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await run.stream.aclose()
                        await gen.stream.aclose()  # aborts the engine request if it is still running
                    finally:
                        self._log_abandoned(run)
                        await admitted.__aexit__(None, None, None)

    def _log_abandoned(self, run: Run) -> None:
        """The client went away before the commit: keep the record, nobody waits for it."""
        if run.committed:
            return
        run.committed = True
        if not run.prepared.store:
            return
        run.finish_reason = run.finish_reason or "abort"
        run.ended = run.ended or time.perf_counter()
        try:
            self.writer.submit(self._record(run))
        except (WriterFull, WriterDown) as exc:
            self.metrics.inc("server/log_dropped")
            log.error("response %s of a vanished client not logged: %s", run.prepared.response_id, exc)

    async def _pieces(self, run: Run, gen: AsyncIterator) -> AsyncIterator[Piece]:
        text = TextStream(self.tokenizer, run.prepared.stops)
        async for delta in gen:
            if run.first_token_at is None and delta.token_ids:
                run.first_token_at = time.perf_counter()
            version = run.spans.add(len(delta.token_ids), delta.version)
            run.token_ids += delta.token_ids
            run.logprobs += delta.logprobs
            if delta.top_logprobs:
                run.top_logprobs += delta.top_logprobs
            chunk = text.add(delta.token_ids)
            if text.stopped:
                run.finish_reason = "stop"
                run.stop_sequence = text.stop_sequence
            elif delta.finish_reason:
                run.finish_reason = delta.finish_reason
                chunk += text.finish()
            run.text = text.text
            yield Piece(chunk, delta.token_ids, delta.logprobs, delta.top_logprobs, version)
            if run.finish_reason:
                break
        run.ended = time.perf_counter()
        if run.finish_reason is None:
            run.finish_reason = "abort"

    # -- 3. durable record ---------------------------------------------------------------------------
    def _record(self, run: Run) -> ResponseRecord:
        p = run.prepared
        ended = run.ended or time.perf_counter()
        return ResponseRecord(
            id=p.response_id,
            api_key_id=p.principal.key_id,
            model=self.model_name,
            policy_version=run.version,
            endpoint=p.endpoint,
            prompt_ids=p.prompt_ids,
            response_ids=tuple(run.token_ids),
            behavior_logprobs=tuple(run.logprobs),
            finish_reason=run.finish_reason or "abort",
            temperature=p.sampling.temperature,
            top_p=p.sampling.top_p,
            seed=p.sampling.seed,
            latency_ms=(ended - run.started) * 1000,
            ttft_ms=None if run.first_token_at is None else (run.first_token_at - run.started) * 1000,
            request_meta=p.meta,
            segment=run.segment,
            version_spans=run.spans.record(),
        )

    async def commit(self, run: Run) -> None:
        """Write the response durably; only then may the client be told it is complete. Raises
        WriterFull / WriterDown (nothing was queued) or LogFailed (the store refused it, or did not
        commit it within the deadline)."""
        record = self._record(run)
        if run.prepared.store:
            fut = self.writer.submit_async(record)  # raises before anything is queued
            run.committed = True
            try:
                await self.writer.wait(fut)  # raises WriterSlow past the deadline (the write may still land)
            except asyncio.CancelledError:
                raise
            except WriterSlow as exc:
                self.metrics.inc("server/log_timeouts")
                raise LogFailed.too_slow(exc) from exc
            except Exception as exc:
                self.metrics.inc("server/log_failures")
                raise LogFailed("the response could not be logged; please retry") from exc
        run.committed = True
        self.metrics.inc("server/responses", endpoint=run.prepared.endpoint)
        self.metrics.inc("server/completion_tokens", len(run.token_ids))
        self.metrics.observe("server/latency_seconds", record.latency_ms / 1000)
        if record.ttft_ms is not None:
            self.metrics.observe("server/ttft_seconds", record.ttft_ms / 1000)
