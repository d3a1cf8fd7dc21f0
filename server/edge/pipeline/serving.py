"""The serving pipeline between the HTTP edge and the engine: request -> prompt token ids and
sampling params (with every limit checked before anything runs), an admitted generation whose
version is known before the first byte goes out, text and stop strings, and the durable log record.

    prepared = await serving.prepare(req, principal, work)   # the endpoint's `work`; InvalidRequest / UnknownModel
    async with serving.runs(serving.choices(prepared, n)) as runs:  # admitted (slots, the engine's gate): run.version
        async for piece in runs[0]: ...                      # text + tokens as they arrive
        await serving.commit(runs[0])                        # durable in the store; then reply

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
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from liveloop.metrics import Metrics
from liveloop.release.routing import user_key
from liveloop.segments import Lineage
from liveloop.server.edge.admission import Admission
from liveloop.server.edge.principal import Principal
from liveloop.server.config import EngineConfig, ServerConfig
from liveloop.server.engines.base import Engine, GenerationRequest, SamplingParams, TokenDelta
from liveloop.server.edge.pipeline.fair_thread import FairThread
from liveloop.server.edge.pipeline.prompting import Prompter
from liveloop.server.edge.response_ids import new_response_id
from liveloop.server.edge.sessions import ClientSession
from liveloop.server.edge.pipeline.splicing import CarriedTurn, Splicer, carries
from liveloop.server.edge.pipeline.text import TextStream
from liveloop.server.edge.formats.tool_parsers import Parsed
from liveloop.server.edge.formats.tools import JSONReply, Tool, ToolChoice, ToolUse, after_user, check_tool_results, output_message
from liveloop.sampling import drawn_temperature
from liveloop.store import BatchWriter, ResponseRecord, WriterDown, WriterFull
from liveloop.store.linking import LinkKeys, episode_tag
from liveloop.store.writer import WriterSlow

log = logging.getLogger(__name__)
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
    messages: tuple[dict[str, Any], ...] | None = None  # the conversation asked (stored shape); None: a completion
    tool_use: ToolUse | None = None  # the tools offered and how they may be used
    requested_max_tokens: int | None = None  # what the client asked, where it was clamped to fit the context
    previous_response_id: str | None = None  # the Responses API: the turn this one continues
    options: dict[str, Any] | None = None  # what a later read of the response echoes (instructions, tool_choice, ...)
    group_id: str | None = None  # n > 1: the first choice's id, on every choice of the request
    choice_index: int = 0
    prompt_text: str | None = None  # a chat-shaped request's rendered prompt (server/edge/pipeline/splicing.py)
    session: ClientSession | None = None  # the client's session (server/edge/sessions.py): its episode, or a side call
    constraint_param: str = "tools"  # the field a constraint that does not compile is refused by

    @property
    def clamped(self) -> bool:
        return self.requested_max_tokens is not None and self.requested_max_tokens != self.sampling.max_tokens


@dataclass(frozen=True)
class Ask:
    """What a request asks beyond its prompt, as `Serving._prepared` takes it."""

    max_tokens: int | None
    top_logprobs: int = 0
    meta: Mapping[str, str] | None = None
    user: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    tool_use: ToolUse | None = None
    constraint: str | None = None
    constraint_param: str = "tools"  # the field a constraint that does not compile is refused by
    clamp: bool = False  # a max_tokens past the context shrinks to fit (Anthropic's clients send 32k and more)
    previous_response_id: str | None = None
    options: dict[str, Any] | None = None


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
    parsed: Parsed | None = None  # the reply read as a message (text and tool calls), once it ended
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache held (usage's cached_tokens)
    spans: VersionSpans = field(init=False)

    def __post_init__(self) -> None:
        self.spans = VersionSpans(self.version)

    def __aiter__(self) -> AsyncIterator[Piece]:
        return self.stream

    def message(self) -> Parsed:
        """The reply as a message: its text, and the tool calls in it when the request offered tools
        (read once the generation ended; a stream's format sets what it streamed)."""
        if self.parsed is None:
            use = self.prepared.tool_use
            self.parsed = use.parse(self.text) if use is not None else Parsed(self.text or None, ())
        return self.parsed

    @property
    def calls_tools(self) -> bool:
        return bool(self.message().calls)


@dataclass(frozen=True)
class Rendered:
    prompt_ids: list[int]
    ask: Ask
    text: str | None = None  # the prompt's text (a served turn's text hash is of it: server/edge/pipeline/splicing.py)


def _wrap_seed(seed: int) -> int:
    """A seed kept in the signed 64-bit range the store holds."""
    return (seed + 2**63) % 2**64 - 2**63


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
        canary: Callable[[str, Lineage], bool] | None = None,
        carried: CarriedTurn | None = None,
        canary_by: str = "key",
    ):
        self.engine = engine
        self.canary_by = canary_by  # what a request is routed by ([release] canary_by: release/routing.py)
        self.canary = canary or (lambda user, lineage: False)  # (user, lineage) -> a canary candidate serves it (the gate's rule)
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
        # templating and tokenizing, off the loop: one thread, so no two encodes of the tokenizer run at once,
        # one job of each waiting key in turn, as many waiting per key as it may run (fair_thread.py)
        self._prompts = FairThread(server.max_concurrent_per_key)
        # whether a request's constraint compiles (up to grammar_compile_seconds each), keys in turn too
        self._grammars = FairThread(server.max_concurrent_per_key, name="liveloop-grammars")
        self.stream_interval = server.stream_interval_ms / 1000  # seconds between a stream's writes (0: a write per delta)
        self.prompter = Prompter(tokenizer, model_dir, engine_config.tool_call_parser, engine_config.constrained_json, engine,
                                 engine_config.json_max_string, server.grammar_compile_seconds)
        # a resent conversation's earlier turns as the tokens sampled (`carried`: the store's read of them)
        self.splicer = Splicer(tokenizer, self.stop_token_ids, carried, metrics)

    # -- 1. request -> prompt ids + sampling --------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise UnknownModel(model)

    async def prepare(self, req: Any, principal: Principal, work: Callable[[Any, Principal], Prepared]) -> Prepared:
        """`work(req, principal)` (the endpoint's own prepare) with the text's length checked here, before
        anything is rendered, the rendering and tokenizing on the prompt thread (the event loop never does
        either), then its constraint's compile checked on the grammar thread."""
        self.check_model(req.model)
        self.check_chars(req)
        prepared = await self.on_prompt_thread(lambda: work(req, principal), principal.key_id)
        constraint = prepared.sampling.constraint
        if constraint is not None:  # on a thread of its own: a slow compile never holds the prompt thread
            await self._grammars.run(principal.key_id, lambda: self.prompter.check(constraint, prepared.constraint_param))
        return prepared

    async def on_prompt_thread(self, work: Callable[[], Any], key: str) -> Any:
        """`work()` on the one prompt thread (templating and tokenizing: never two encodes at once), in
        `key`'s turn (raises Busy when that key has `max_concurrent_per_key` jobs waiting)."""
        return await self._prompts.run(key, work)

    def check_chars(self, req: Any) -> None:
        """Refuse a text longer than `max_prompt_chars` (a cheap bound: the context holds fewer tokens
        than that), before the chat template or the tokenizer sees it. Each request model counts its
        own text (`chars()`) and names the field it is in (`chars_param`); the tool definitions, which
        the template renders into the prompt too, count as their JSON (param `tools` when they are most)."""
        text, tools = req.chars(), sum(len(t.model_dump_json()) for t in getattr(req, "tools", None) or ())
        n, param = text + tools, ("tools" if tools > text else req.chars_param)
        if n > self.max_prompt_chars:
            raise InvalidRequest(
                f"this model's maximum context length is {self.max_model_len} tokens; the text and tools have {n} "
                f"characters (at most {self.max_prompt_chars} are taken)",
                param,
                code="context_length_exceeded",
            )

    def close(self) -> None:
        self._prompts.close()
        self._grammars.close()
        self.prompter.close()

    def conversation(self, messages: list[dict[str, Any]], tools: list[Tool], choice: ToolChoice, parallel: bool,
                     json_reply: JSONReply | None, format_param: str,
                     stored: list[dict[str, Any]] | None = None, key_id: str | None = None, **ask: Any) -> Rendered:
        """A chat-shaped request's prompt and what it asks: the conversation rendered (`render_chat`),
        the constraint checked (server/edge/pipeline/prompting.py). `stored`: the part of `messages` the store keeps
        (default all of it); `key_id`: whose earlier turns its text may carry as their own tokens
        (server/edge/pipeline/splicing.py). Raises ToolsRefused (a 400)."""
        choice = after_user(messages, tools, choice) if self.server.auto_tool_choice == "required_after_user" else choice
        tool_use, prompt_ids, text = self.render_chat(messages, tools, choice, parallel, key_id=key_id)
        constraint = self.prompter.constraint(tool_use, json_reply, format_param)
        kept = tuple(messages if stored is None else stored)
        param = "tools" if json_reply is None else format_param
        return Rendered(prompt_ids, Ask(messages=kept, tool_use=tool_use, constraint=constraint, constraint_param=param, **ask), text)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Tool], choice: ToolChoice, parallel: bool,
                    generation_prompt: bool = True, key_id: str | None = None) -> tuple[ToolUse | None, list[int], str]:
        """Every tool result answers an earlier call, the tools are checked, and the conversation goes
        through the chat template with them: the one rendering a request, its token count and
        /tokenize share. Raises ToolsRefused (a 400)."""
        check_tool_results(messages)
        tool_use = self.prompter.tool_use(tools, choice, parallel)
        prompt = self.prompter.render(messages, tool_use, generation_prompt)  # typed markers stay text (markers.py)
        carried = key_id if carries(messages) else None  # no assistant message, no earlier turn: no store read
        return tool_use, self.splicer.prompt_ids(prompt, carried), prompt.text

    def prepared(self, endpoint: str, prefix: str, prompt_ids: list[int], ask: Ask, req: Any, principal: Principal,
                 text: str | None = None) -> Prepared:
        """The request's Prepared: its length and max_tokens checked against the context, its sampling
        (`text`: the prompt's, for a chat-shaped request)."""
        max_tokens, meta = ask.max_tokens, ask.meta
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
        requested = None
        if max_tokens is None:
            max_tokens = min(self.server.default_max_tokens, room)
        elif ask.clamp and max_tokens > min(room, self.server.max_tokens_limit):
            requested, max_tokens = max_tokens, min(room, self.server.max_tokens_limit)
        elif max_tokens > self.server.max_tokens_limit:
            raise InvalidRequest(f"max_tokens: at most {self.server.max_tokens_limit}", "max_tokens")
        elif max_tokens > room:
            raise InvalidRequest(
                f"this model's maximum context length is {self.max_model_len} tokens: {n_prompt} in the prompt "
                f"+ {max_tokens} max_tokens is too many",
                "max_tokens",
                code="context_length_exceeded",
            )
        temperature = 1.0 if req.temperature is None else req.temperature  # the Responses API's may be null
        sampling = SamplingParams(
            max_tokens=max_tokens,  # greedy below vLLM's epsilon, vLLM's lowest above it: the same on every engine
            temperature=drawn_temperature(temperature),
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            top_logprobs=ask.top_logprobs,
            stop_token_ids=self._stop_tokens(req),
            top_k=max(0, req.top_k or 0),  # every generating request takes vLLM's extensions (SamplingExtensions)
            min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            min_tokens=req.min_tokens or 0,
            constraint=ask.constraint,
        )
        self._check_sampling(sampling, req)
        return Prepared(
            response_id=new_response_id(prefix),
            endpoint=endpoint,
            prompt_ids=tuple(prompt_ids),
            sampling=sampling,
            stops=req.stops(),
            principal=principal,
            meta=dict(meta) if meta else None,
            created=int(time.time()),
            store=req.store is not False,  # the Responses API's may be null: stored, as everywhere
            segment=self.route(meta),
            user=user_key(ask.user, principal.key_id, self.canary_by),
            messages=ask.messages,
            tool_use=ask.tool_use,
            requested_max_tokens=requested,
            previous_response_id=ask.previous_response_id,
            options=ask.options,
            prompt_text=text,
            constraint_param=ask.constraint_param,
        )

    def _stop_tokens(self, req: Any) -> tuple[int, ...]:
        """The token ids that end the reply: the model's end-of-sequence ids (unless `ignore_eos`) and
        the request's `stop_token_ids`."""
        extra = req.stop_token_ids or []
        if any(t >= self.vocab_size for t in extra):
            raise InvalidRequest(f"stop_token_ids: token ids must be < {self.vocab_size}", "stop_token_ids")
        model = () if req.ignore_eos else self.stop_token_ids
        return tuple(sorted(set(model) | set(extra)))

    def _check_sampling(self, s: SamplingParams, req: Any) -> None:
        """Refuse sampling options the engine does not honour, and ones a constraint cannot meet."""
        for name in s.extensions():
            if name not in self.engine.sampling_extensions:
                raise InvalidRequest(f"{name}: the {self.engine.name} engine does not serve it", name, code="unsupported_by_engine")
        if s.constraint is not None:
            if req.ignore_eos:
                raise InvalidRequest("ignore_eos: a constrained reply (forced tool call, JSON output) ends where its grammar does", "ignore_eos")
            if s.min_tokens:
                raise InvalidRequest("min_tokens: a constrained reply (forced tool call, JSON output) ends where its grammar does", "min_tokens")

    def choices(self, prepared: Prepared, n: int) -> list[Prepared]:
        """The `n` generations a request asks for (n > 1: each its own response id, rateable and
        trained as its own sample, all with the group id of the first; a seed s gives choice i the
        seed s + i, so they differ and each is reproducible)."""
        if n == 1:
            return [prepared]
        out = []
        for i in range(n):
            rid = prepared.response_id if i == 0 else f"{prepared.response_id}-{i}"
            seed = None if prepared.sampling.seed is None else _wrap_seed(prepared.sampling.seed + i)
            out.append(dataclasses.replace(
                prepared, response_id=rid, sampling=dataclasses.replace(prepared.sampling, seed=seed),
                group_id=prepared.response_id, choice_index=i,
            ))
        return out

    # -- 2. admitted generations -> pieces -----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def runs(self, choices: list[Prepared]) -> AsyncIterator[list[Run]]:
        """A request's generations (its `choices`), admitted together: within its key's storage budget when
        it stores (raises StorageSpent), their slots all or none (raises Busy with nothing started), then
        each through the engine's gate."""
        if choices[0].store:
            await self.admission.check_storage(choices[0].principal.key_id)
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(self.admission.generation(choices[0].principal.key_id, len(choices)))
            yield [await stack.enter_async_context(self._run(p)) for p in choices]

    @contextlib.asynccontextmanager
    async def _run(self, prepared: Prepared) -> AsyncIterator[Run]:
        """One generation, its slot held by `runs`."""
        canary = self.canary(prepared.user, Lineage(prepared.segment))  # decided at admission: the candidate may change
        request = GenerationRequest(prepared.response_id, prepared.prompt_ids, prepared.sampling, Lineage(prepared.segment), canary)
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
            if delta.cached_tokens is not None:  # at most the prompt: every API reports it as a part of it
                run.cached_tokens = min(delta.cached_tokens, len(run.prepared.prompt_ids))
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
        side = p.session is not None and p.session.side is not None
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
            messages=None if p.messages is None else list(p.messages),
            tools=None if p.tool_use is None else p.tool_use.definitions(),
            output=output_message(run.message()) if p.messages is not None else None,
            grammar=p.sampling.constraint,
            sampling=p.sampling.recorded(self.engine.logprobs_of),
            previous_response_id=p.previous_response_id,
            options=p.options,
            group_id=p.group_id,
            choice_index=p.choice_index,
            # a side call (server/edge/sessions.py) is stored apart: no link keys, no episode tag
            link=None if side else LinkKeys.of(p.prompt_ids, run.token_ids, self.stop_token_ids, self.splicer.text_hash(p.prompt_text, run.token_ids)),
            episode_tag=None if side else p.session.tag if p.session is not None else episode_tag(p.meta),
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
