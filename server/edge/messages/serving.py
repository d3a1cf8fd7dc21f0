"""Anthropic messages (POST /v1/messages): the `message` object and its stream of named events, as
the official `anthropic` client reads them; and the token count of POST /v1/messages/count_tokens.

A whole response: `{"id": "msg_...", "type": "message", "role": "assistant", "content": [{"type":
"text", "text": ...}, {"type": "tool_use", "id": "toolu_...", "name": ..., "input": {...}}, ...],
"model", "stop_reason", "stop_sequence", "usage": {"input_tokens", "output_tokens", "cache_creation_input_tokens": 0,
"cache_read_input_tokens"}}` (the prompt tokens the prefix cache held; `input_tokens` the rest) plus liveloop's
`policy_version`, `version_spans` (as on chat completions) and `finish_reason` (liveloop's own: "abort"
has no Anthropic stop reason and reads "end_turn"). The id is the response id `/v1/feedback` rates.
`stop_reason`: "end_turn" (the model ended it), "tool_use" (it ended with tool calls), "max_tokens",
"stop_sequence" (with the one in `stop_sequence`). A `max_tokens` past what the context has room for
is served as the room there is, and the response says so: `max_tokens_clamped` `{"requested", "to"}`
(Anthropic's clients send 32k and more; the model's context is what it is).

A stream: `message_start` (the message with empty content and the admitted version), `ping`, then
each content block as `content_block_start`, its deltas (`text_delta`; a tool use's arguments as
`input_json_delta` fragments adding up to its input's JSON), `content_block_stop`; then `message_delta`
(stop reason, the usage again with the output tokens, `version_spans`), `message_stop`; the last two only once the response is
logged. Without tools the text block opens at once (before `ping`, as Anthropic sends it); with tools a
block opens when its first text or call arrives, so a reply that only calls a tool has no empty text
block. A failure after the status went out is an `error` event in Anthropic's error shape
(server/edge/errors.py). No thinking blocks: the served models do not think. A chat template that refuses
a system turn mid-conversation gets them folded into user text (server/edge/messages/normalise.py), for
the generation and its token count alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request

from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import anthropic_error_body
from liveloop.server.edge.formats.tools import ToolsRefused
from liveloop.server.edge.messages.normalise import fold_system_turns, has_mid_system
from liveloop.server.edge.messages.protocol import CountTokensRequest, MessagesRequest
from liveloop.server.edge.pipeline.serving import Piece, Prepared, Run, Serving
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.pipeline.streaming import EndpointServing, Format, json_text, spans
from liveloop.server.edge.formats.tool_parsers import StreamDelta, ToolStream

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
T = TypeVar("T")


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict[str, int]:
    """Anthropic's usage object: the prompt tokens the engine's prefix cache held are
    `cache_read_input_tokens` and the rest `input_tokens` (Anthropic's counts add up to the prompt);
    no cache is written on request, so `cache_creation_input_tokens` is 0."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached_tokens}


def render_folding(messages: list[dict[str, Any]], render: Callable[[list[dict[str, Any]]], T]) -> T:
    """`render(messages)`; where the chat template refused them and they hold a system turn after the
    first message, `render` of them with those turns folded into user text."""
    try:
        return render(messages)
    except ToolsRefused as exc:
        if exc.param != "messages" or not has_mid_system(messages):
            raise
    return render(fold_system_turns(messages))


def event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json_text(data)}\n\n".encode()


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic names tool uses (`toolu_...`): the same random part as its `call_` id."""
    return "toolu_" + call_id.removeprefix("call_")


def text_delta(index: int, text: str) -> bytes:
    """The `content_block_delta` event of text (what `event` writes, with one JSON encoding of the text)."""
    return (f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":{index},'
            f'"delta":{{"type":"text_delta","text":{json.dumps(text)}}}}}\n\n').encode()


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as Anthropic's `input` object; a JSON value that is not an object goes as
    {"value": ...} (a whole reply's calls always hold valid JSON; a streamed one cut short, none)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


class MessagesFormat(Format):
    def __init__(self, serving: Serving, req: MessagesRequest, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        use = prepared.tool_use
        self._tools: ToolStream | None = use.stream() if use is not None else None
        self._block: str | None = None  # the kind of the open content block ("text", "tool_use")
        self._index = -1  # the open (or last) block's index

    def _stop(self, run: Run) -> tuple[str, str | None]:
        if run.finish_reason == "stop" and run.stop_sequence is not None:
            return "stop_sequence", run.stop_sequence
        if run.finish_reason == "stop" and run.calls_tools:
            return "tool_use", None
        return STOP_REASONS.get(run.finish_reason or "", "end_turn"), None

    def _message(self, run: Run, content: list[dict], stop_reason: str | None, stop_sequence: str | None, output_tokens: int) -> dict:
        body = {
            "id": self.prepared.response_id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.serving.model_name,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage(len(self.prepared.prompt_ids), output_tokens, run.cached_tokens),
            "policy_version": run.version,
        }
        if self.prepared.clamped:
            body["max_tokens_clamped"] = {"requested": self.prepared.requested_max_tokens, "to": self.prepared.sampling.max_tokens}
        return body

    def _content(self, run: Run) -> list[dict]:
        if self.prepared.tool_use is None:
            return [{"type": "text", "text": run.text}]
        parsed = run.message()
        blocks: list[dict] = [{"type": "text", "text": parsed.content}] if parsed.content else []
        blocks += [{"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": _input(c.arguments)} for c in parsed.calls]
        return blocks

    def whole(self, runs: list[Run]) -> dict:
        run = runs[0]
        reason, sequence = self._stop(run)
        body = self._message(run, self._content(run), reason, sequence, len(run.token_ids))
        return {**body, "version_spans": spans(run), "finish_reason": run.finish_reason, **self._token_ids(run)}

    def _token_ids(self, run: Run) -> dict[str, list[int]]:
        """`return_token_ids`: the engine's own tokens, for a trainer of its own (vLLM's extension)."""
        if not self.req.return_token_ids:
            return {}
        return {"prompt_token_ids": list(self.prepared.prompt_ids), "token_ids": list(run.token_ids)}

    def headers(self, runs: list[Run]) -> dict[str, str]:
        out = super().headers(runs)
        if self.prepared.clamped:
            out["x-liveloop-max-tokens"] = str(self.prepared.sampling.max_tokens)
        return out

    # -- the stream -----------------------------------------------------------------------------------
    def opening(self, runs: list[Run]) -> bytes:
        start = event("message_start", {"type": "message_start", "message": self._message(runs[0], [], None, None, 0)})
        if self._tools is not None:
            return start + event("ping", {"type": "ping"})
        self._block, self._index = "text", 0
        return (
            start
            + event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            + event("ping", {"type": "ping"})
        )

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        text = "".join(piece.text for piece in pieces)
        if self._tools is None:
            return self._text(text)
        return b"".join(self._delta(self._tools.feed(piece.text)) for piece in pieces)

    def settle(self, run: Run) -> bytes:
        if self._tools is None:
            run.message()
            return b""
        out = self._delta(self._tools.finish())
        run.parsed = self._tools.result
        return out

    def _text(self, text: str) -> bytes:
        if not text:
            return b""
        out = self._open("text", {"type": "text", "text": ""}) if self._block != "text" else b""
        return out + text_delta(self._index, text)

    def _delta(self, delta: StreamDelta) -> bytes:
        out = self._text(delta.text)
        for c in delta.calls:
            if c.id is not None:
                out += self._open("tool_use", {"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": {}})
            if c.arguments:
                out += event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                     "delta": {"type": "input_json_delta", "partial_json": c.arguments}})
        return out

    def _open(self, kind: str, block: dict) -> bytes:
        out = self._close()
        self._block, self._index = kind, self._index + 1
        return out + event("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def error(self, status: int, message: str, code: str | None) -> bytes:
        return event("error", anthropic_error_body(status, message))

    def closing(self, runs: list[Run]) -> bytes:
        run = runs[0]
        reason, sequence = self._stop(run)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(len(self.prepared.prompt_ids), len(run.token_ids), run.cached_tokens),
            "policy_version": run.version,
            "version_spans": spans(run),
            "finish_reason": run.finish_reason,
            **self._token_ids(run),
        }
        return self._close() + event("message_delta", delta) + event("message_stop", {"type": "message_stop"})


class ServingMessages(EndpointServing):
    request_model = MessagesRequest

    def format(self, req: MessagesRequest, prepared: Prepared) -> MessagesFormat:
        return MessagesFormat(self.serving, req, prepared)

    def prepare(self, req: MessagesRequest, principal: Principal, loaded: Any = None) -> Prepared:
        """The system prompt first, then the turns (tool uses as assistant calls, tool results as tool
        turns), through the same chat template; `metadata.user_id` is who the canary routes by (as
        chat's `user`; Claude Code's JSON string whole), and no segment tags; `output_config.format`
        constrains the reply to its JSON schema. A max_tokens past the context is clamped to what fits
        (the response says so)."""
        serving = self.serving
        serving.check_model(req.model)
        tools, choice, parallel = req.tool_setup()
        ask = render_folding(req.conversation(), lambda messages: serving.conversation(
            messages, tools, choice, parallel, req.json_reply(), "output_config.format",
            max_tokens=req.max_tokens, user=req.user(), clamp=True, key_id=principal.key_id))
        return serving.prepared("messages", "msg", ask.prompt_ids, ask.ask, req, principal, ask.text)

    async def count_tokens(self, request: Request, principal: Principal) -> dict[str, int]:
        """POST /v1/messages/count_tokens: the prompt's tokens as /v1/messages would render them for
        this key (tools included, its earlier turns' own tokens reused), on the prompt thread."""
        serving = self.serving
        serving.admission.check_rate(self.rate_bucket, principal.key_id)
        req = await parse_body(request, CountTokensRequest)
        serving.check_model(req.model)
        serving.check_chars(req)

        def work() -> int:
            setup = req.tool_setup()
            return len(render_folding(req.conversation(), lambda messages: serving.render_chat(messages, *setup, key_id=principal.key_id))[1])

        return {"input_tokens": await serving.on_prompt_thread(work, principal.key_id)}
