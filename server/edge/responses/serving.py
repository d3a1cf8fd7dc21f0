"""The Responses API's generation (POST /v1/responses) and its bodies (GET /v1/responses/{id} too): the
`response` object and its stream of typed events, as the official `openai` client and Codex read them.

A response: `{"id": "resp_...", "object": "response", "status": "completed" | "incomplete", "output",
"usage", ...}` echoing what was asked, plus `ignored_tools` (the built-in tools not offered) and
liveloop's `policy_version` and `version_spans`. Output items: the text as one message item (`msg_...`,
one `output_text` part), then each call as its tool's kind says (server/edge/responses/tools.py): a
`function_call` (`fc_...`, `call_id` the `call_...` id its output answers, `arguments` the JSON the
model wrote, `namespace` for a namespaced function) or a `custom_tool_call` (`ctc_...`, `input`). A
reply cut by `max_output_tokens` is "incomplete" (`incomplete_details.reason`). The id is rateable
with /v1/feedback and deleted with its ratings by DELETE (server/edge/ownership.py's one rule).

`previous_response_id` continues a conversation server-side: the turns before are read from the
store (the key's own), each its own input and its output, then this turn's input; `instructions` are
this turn's alone. What the store keeps for a turn is its own input.

A stream, each event with its `sequence_number`: `response.created`, `response.in_progress`, then per
output item `response.output_item.added`; for the message `response.content_part.added`,
`response.output_text.delta`s, `.done`, `response.content_part.done`; for a function call
`response.function_call_arguments.delta`s and `.done`; for a custom call one
`response.custom_tool_call_input.delta` and `.done`; then `response.output_item.done`; last, once the
response is logged, `response.completed` (or `response.incomplete`). A failure after the status went
out is an `error` event and `response.failed`."""

from __future__ import annotations

import asyncio
from typing import Any

from liveloop.server.edge.principal import Principal
from liveloop.server.edge.responses.protocol import ResponsesRequest
from liveloop.server.edge.responses.tools import call_item, custom_input
from liveloop.server.edge.pipeline.serving import InvalidRequest, Piece, Prepared, Run, Serving
from liveloop.server.edge.formats.openai import sse
from liveloop.server.edge.pipeline.streaming import EndpointServing, Format, Generating, spans
from liveloop.server.edge.formats.tool_parsers import StreamDelta, ToolStream
from liveloop.server.edge.formats.tools import output_message
from liveloop.store import ChainTooLong, StoredConversation
from liveloop.store.conversations import ConversationQueries

ENDPOINTS = ("responses",)


def message_item_id(response_id: str) -> str:
    return "msg_" + response_id.removeprefix("resp_")


def call_item_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


def output_items(response_id: str, message: dict[str, Any] | None, status: str = "completed",
                 options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A stored reply message as Responses output items: the text (if any), then each call (as its
    tool's kind says: `options`' maps, server/edge/responses/tools.py)."""
    if message is None:
        return []
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append(_message_item(response_id, message["content"], status))
    for call in message.get("tool_calls") or ():
        items.append(_call_item(call["id"], call["function"]["name"], call["function"]["arguments"], status, options))
    return items


def _message_item(response_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" else []
    return {"id": message_item_id(response_id), "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(call_id: str, name: str, arguments: str, status: str, options: dict[str, Any] | None) -> dict[str, Any]:
    return call_item(call_item_id(call_id), call_id, name, arguments, status, options or {})


def input_items(messages: list[dict[str, Any]], options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A turn's stored input as Responses input items (GET /v1/responses/{id}/input_items)."""
    items: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            items.append({"id": f"fco_{i}", "type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"], "status": "completed"})
            continue
        if m.get("content"):
            kind = "output_text" if m["role"] == "assistant" else "input_text"
            items.append({"id": f"msg_in_{i}", "type": "message", "role": m["role"], "status": "completed",
                          "content": [{"type": kind, "text": m["content"]}]})
        for call in m.get("tool_calls") or ():
            items.append(_call_item(call["id"], call["function"]["name"], call["function"]["arguments"], "completed", options))
    return items


def response_body(
    *, response_id: str, created: int, model: str, options: dict[str, Any], tools: list[dict[str, Any]] | None,
    metadata: dict[str, Any] | None, previous_response_id: str | None, status: str, output: list[dict[str, Any]],
    input_tokens: int, output_tokens: int, version: int, version_spans: list[dict[str, int]] | None, cached_tokens: int = 0,
) -> dict[str, Any]:
    """The `response` object (a whole response, the stream's snapshots, a read of a stored one);
    `cached_tokens`: the input tokens the engine's prefix cache held (not stored: 0 on a read)."""
    text_format = options.get("text_format") or {"type": "text"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": options.get("instructions"),
        "max_output_tokens": options.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": options.get("parallel_tool_calls", True),
        "previous_response_id": previous_response_id,
        "temperature": options.get("temperature", 1.0),
        "top_p": options.get("top_p", 1.0),
        "text": {"format": text_format},
        "tool_choice": options.get("tool_choice", "auto"),
        "tools": [{"type": "function", **t["function"]} for t in tools or ()],
        "ignored_tools": options.get("ignored_tools") or [],
        "reasoning": {"effort": None, "summary": None, **(options.get("reasoning") or {})},
        "truncation": "disabled",
        "store": options.get("store", True),
        "user": options.get("user"),
        "metadata": metadata or {},
        "usage": None if status == "in_progress" else {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
        "policy_version": version,
        "version_spans": version_spans,
    }


def stored_body(c: StoredConversation) -> dict[str, Any]:
    """A stored response as GET /v1/responses/{id} returns it."""
    status = "incomplete" if c.finish_reason == "length" else "completed"
    version_spans = [{"start": a, "end": b, "version": v} for a, b, v in c.version_spans] if c.version_spans else (
        [{"start": 0, "end": c.completion_tokens, "version": c.policy_version}] if c.completion_tokens else [])
    return response_body(
        response_id=c.id, created=int(c.created_at.timestamp()), model=c.model, options=c.options or {}, tools=c.tools,
        metadata=c.request_meta, previous_response_id=c.previous_response_id, status=status,
        output=output_items(c.id, c.output, status, c.options), input_tokens=c.prompt_tokens, output_tokens=c.completion_tokens,
        version=c.policy_version, version_spans=version_spans,
    )


class ResponsesFormat(Format):
    def __init__(self, serving: Serving, req: ResponsesRequest, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        use = prepared.tool_use
        self._tools: ToolStream | None = use.stream() if use is not None else None
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # the output items opened so far (completed as they close)
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""  # the open message item's text so far
        self._args = ""  # the open call's arguments so far
        self._run: Run | None = None

    def _status(self, run: Run) -> str:
        return "incomplete" if run.finish_reason == "length" else "completed"

    def _body(self, run: Run, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        p = self.prepared
        body = response_body(
            response_id=p.response_id, created=p.created, model=self.serving.model_name, options=p.options or {},
            tools=None if p.tool_use is None else p.tool_use.definitions(), metadata=p.meta,
            previous_response_id=p.previous_response_id, status=status, output=output,
            input_tokens=len(p.prompt_ids), output_tokens=len(run.token_ids), version=run.version,
            version_spans=None if status == "in_progress" else spans(run), cached_tokens=run.cached_tokens,
        )
        if self.req.return_token_ids and status != "in_progress":  # the engine's own tokens, for a trainer of its own
            body |= {"prompt_token_ids": list(p.prompt_ids), "token_ids": list(run.token_ids)}
        return body

    def _message(self, run: Run) -> dict[str, Any]:
        return output_message(run.message())

    def whole(self, runs: list[Run]) -> dict:
        run = runs[0]
        status = self._status(run)
        return self._body(run, status, output_items(self.prepared.response_id, self._message(run), status, self.prepared.options))

    # -- the stream -----------------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> bytes:
        out = sse({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1
        return out

    def opening(self, runs: list[Run]) -> bytes:
        self._run = runs[0]
        body = self._body(runs[0], "in_progress", [])
        return self._event("response.created", response=body) + self._event("response.in_progress", response=body)

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        if self._tools is None:
            return self._write_text("".join(piece.text for piece in pieces))
        return b"".join(self._write(self._tools.feed(piece.text)) for piece in pieces)

    def settle(self, run: Run) -> bytes:
        if self._tools is None:
            run.message()
            return self._close()
        out = self._write(self._tools.finish())
        run.parsed = self._tools.result
        return out + self._close()

    def _write(self, delta: StreamDelta) -> bytes:
        out = self._write_text(delta.text)
        for c in delta.calls:
            if c.id is not None:
                out += self._close()
                item = _call_item(c.id, c.name, "", "in_progress", self.prepared.options)
                out += self._event("response.output_item.added", output_index=len(self._items), item=item)
                self._items.append(item)
                self._open, self._args = item, ""
            if c.arguments:
                self._args += c.arguments
                if self._open["type"] == "custom_tool_call":
                    continue  # its input is the arguments' `input`: sent whole when the call closes
                self._open["arguments"] += c.arguments
                out += self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                                   output_index=len(self._items) - 1, delta=c.arguments)
        return out

    def _write_text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open is None or self._open["type"] != "message":
            out += self._close()
            item = _message_item(self.prepared.response_id, "", "in_progress")
            index = len(self._items)
            out += self._event("response.output_item.added", output_index=index, item=item)
            out += self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            self._items.append(item)
            self._open, self._text = item, ""
        self._text += text
        return out + self._event("response.output_text.delta", item_id=self._open["id"], output_index=len(self._items) - 1,
                                 content_index=0, delta=text, logprobs=[])

    def _close(self) -> bytes:
        """End the open item's events; it is completed in the output list."""
        item, self._open = self._open, None
        if item is None:
            return b""
        index = len(self._items) - 1
        if item["type"] == "message":
            part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
            done = _message_item(self.prepared.response_id, self._text, "completed")
            out = (self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=self._text, logprobs=[])
                   + self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part))
        elif item["type"] == "custom_tool_call":
            text = custom_input(self._args)
            done = {**item, "input": text, "status": "completed"}
            out = (self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                               call_id=item["call_id"], delta=text) if text else b"")
            out += self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                               call_id=item["call_id"], input=text)
        else:
            done = {**item, "status": "completed"}
            out = self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
        self._items[index] = done
        return out + self._event("response.output_item.done", output_index=index, item=done)

    def error(self, status: int, message: str, code: str | None) -> bytes:
        """An `error` event, then `response.failed` with the error (what Codex reads: it ignores `error`)."""
        out = self._event("error", code=code, message=message, param=None)
        if self._run is None:
            return out
        body = self._body(self._run, "failed", [i for i in self._items if i.get("status") == "completed"])
        body["error"] = {"code": code or "server_error", "message": message}
        return out + self._event("response.failed", response=body)

    def closing(self, runs: list[Run]) -> bytes:
        run = runs[0]
        status = self._status(run)
        body = self._body(run, status, output_items(self.prepared.response_id, self._message(run), status, self.prepared.options))
        return self._event("response.completed" if status == "completed" else "response.incomplete", response=body)


class ServingResponses(EndpointServing):
    request_model = ResponsesRequest

    def __init__(self, serving: Serving, generating: Generating, conversations: ConversationQueries):
        super().__init__(serving, generating)
        self.conversations = conversations

    def format(self, req: ResponsesRequest, prepared: Prepared) -> ResponsesFormat:
        return ResponsesFormat(self.serving, req, prepared)

    async def load(self, req: ResponsesRequest, principal: Principal) -> list[dict[str, Any]]:
        """The turns before this one (off the event loop), for `prepare`."""
        history: list[dict[str, Any]] = []
        if req.previous_response_id is None:
            return history
        try:
            turns = await asyncio.to_thread(self.conversations.chain, req.previous_response_id, principal.key_id, ENDPOINTS)
        except ChainTooLong as exc:
            raise InvalidRequest(str(exc), "previous_response_id", code="conversation_too_long") from None
        if turns is None:
            raise InvalidRequest(f"previous_response_id: no response `{req.previous_response_id}` for this API key",
                                 "previous_response_id", code="previous_response_not_found")
        for turn in turns:
            history += turn.messages + ([turn.output] if turn.output is not None else [])
        chars = req.chars() + sum(len(m.get("content") or "") + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls") or ())
                                  for m in history)
        if chars > self.serving.max_prompt_chars:  # bounded before the template renders it, as a request's own text is
            raise InvalidRequest(
                f"this model's maximum context length is {self.serving.max_model_len} tokens; the conversation so far has "
                f"{chars} characters (at most {self.serving.max_prompt_chars} are taken)", "previous_response_id",
                code="context_length_exceeded",
            )
        return history

    def prepare(self, req: ResponsesRequest, principal: Principal, history: list[dict[str, Any]]) -> Prepared:
        own = req.conversation()
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        tools, choice, parallel = req.tool_setup()
        rendered = self.serving.conversation(
            system + history + own, tools, choice, parallel, req.json_reply(), "text.format.schema",
            stored=own, max_tokens=req.max_output_tokens, meta=req.metadata, user=req.user, clamp=True,
            previous_response_id=req.previous_response_id, options=req.options(), key_id=principal.key_id,
        )
        return self.serving.prepared("responses", "resp", rendered.prompt_ids, rendered.ask, req, principal, rendered.text)
