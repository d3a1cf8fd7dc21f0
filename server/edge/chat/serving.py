"""OpenAI chat completions (POST /v1/chat/completions): the response and its stream's chunks
(`chat.completion`, `chat.completion.chunk`: a role-only first chunk per choice, content deltas, the
last chunk of each choice with `finish_reason` and `version_spans`), logprobs as `content` entries with
their bytes.

Tool calls: a reply whose text holds calls of offered tools (server/edge/formats/tools.py, the model family's
parser) is a message with `tool_calls` (`call_...` ids, arguments the JSON text the model wrote),
`content` the text around them or null, and `finish_reason` "tool_calls". A stream sends a call as
OpenAI does, so the SDK's accumulation rebuilds it: a delta with the call's `index`, `id`, `type` and
`function.name` (arguments ""), then deltas with that `index` and the next `function.arguments`
fragment, the fragments adding up to the whole arguments text; text that might still turn out to be a
call is held back until it is known (`settle` sends what is left when the reply ends)."""

from __future__ import annotations

from typing import Any

from liveloop.server.edge.chat.protocol import ChatCompletionRequest
from liveloop.server.edge.pipeline.serving import Piece, Prepared, Run
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.formats.openai import OpenAIFormat, sse
from liveloop.server.edge.pipeline.streaming import EndpointServing
from liveloop.server.edge.pipeline.text import token_bytes
from liveloop.server.edge.formats.tool_parsers import CallDelta, StreamDelta, ToolStream
from liveloop.server.edge.formats.tools import output_message


def finish_reason(run: Run) -> str | None:
    """OpenAI's finish reason: "tool_calls" for a reply that ended by itself with calls in it."""
    if run.finish_reason == "stop" and run.calls_tools:
        return "tool_calls"
    return run.finish_reason


def call_deltas(calls: tuple[CallDelta, ...]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        delta: dict[str, Any] = {"index": c.index}
        if c.id is not None:
            delta.update(id=c.id, type="function", function={"name": c.name, "arguments": c.arguments})
        else:
            delta["function"] = {"arguments": c.arguments}
        out.append(delta)
    return out


class ChatFormat(OpenAIFormat):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._tool_streams: dict[int, ToolStream] = {}  # per choice, while its reply streams
        if self.prepared.tool_use is not None and self.prepared.tool_use.parses:
            self.wants_tokens = True  # every piece goes through the tool stream

    def _logprobs_on(self) -> bool:
        return bool(self.req.logprobs)

    def _content_logprobs(self, ids: list[int], lps: list[float], top: list | None) -> dict | None:
        if not self.req.logprobs:
            return None
        tok = self.serving.tokenizer
        entries = []
        for i, (t, lp) in enumerate(zip(ids, lps)):
            alts = top[i] if top and i < len(top) else []
            entries.append(
                {
                    "token": tok.decode([t]),
                    "logprob": lp,
                    "bytes": list(token_bytes(tok, t)),
                    "top_logprobs": [
                        {"token": tok.decode([a]), "logprob": alp, "bytes": list(token_bytes(tok, a))} for a, alp in alts
                    ],
                }
            )
        return {"content": entries}

    def _message(self, run: Run) -> dict[str, Any]:
        if self.prepared.tool_use is None:
            return {"role": "assistant", "content": run.text}
        return output_message(run.message())

    def choice(self, run: Run) -> dict:
        choice: dict[str, Any] = {
            "index": run.prepared.choice_index,
            "message": self._message(run),
            "logprobs": self._content_logprobs(run.token_ids, run.logprobs, run.top_logprobs),
            "finish_reason": finish_reason(run),
        }
        if self.req.return_token_ids:
            choice["token_ids"] = run.token_ids
        return choice

    def first_chunk(self, run: Run) -> dict:
        choice: dict[str, Any] = {"index": run.prepared.choice_index, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}
        if self.several:
            choice["response_id"] = run.prepared.response_id
        body = {**self._head(run, self.chunk_name), "choices": [choice]}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def chunk(self, run: Run, piece: Piece, delta: StreamDelta | None = None) -> dict:
        """A piece's chunk: its text (or what the tool stream `delta` lets out of it, with call deltas)."""
        content = piece.text if delta is None else delta.text
        choice: dict[str, Any] = {
            "index": run.prepared.choice_index,
            "delta": {"content": content} if content or delta is None else {},
            "logprobs": self._content_logprobs(piece.token_ids, piece.logprobs, piece.top_logprobs),
            "finish_reason": None,
        }
        if delta is not None and delta.calls:
            choice["delta"]["tool_calls"] = call_deltas(delta.calls)
        if self.req.return_token_ids:
            choice["token_ids"] = piece.token_ids
        return {**self._head(run, self.chunk_name), "choices": [choice]}

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        tools = self._tool_stream(run)
        if tools is None:
            return super().group(run, pieces)
        out = []
        for piece in pieces:
            delta = tools.feed(piece.text)
            if delta.text or delta.calls or self.req.logprobs or self.req.return_token_ids:
                out.append(sse(self.chunk(run, piece, delta)))
        return b"".join(out)

    def settle(self, run: Run) -> bytes:
        tools = self._tool_streams.pop(run.prepared.choice_index, None)
        if tools is None:
            run.message()
            return b""
        delta = tools.finish()
        run.parsed = tools.result  # what went out is the message: the stored calls are the streamed ones
        if not (delta.text or delta.calls):
            return b""
        return sse(self.chunk(run, Piece("", [], [], None, run.version), delta))

    def _tool_stream(self, run: Run) -> ToolStream | None:
        use = self.prepared.tool_use
        if use is None or not use.parses:
            return None
        index = run.prepared.choice_index
        if index not in self._tool_streams:
            self._tool_streams[index] = use.stream()
        return self._tool_streams[index]

    def final_choice(self, run: Run) -> dict:
        return {"index": run.prepared.choice_index, "delta": {}, "logprobs": None, "finish_reason": finish_reason(run)}


class ServingChat(EndpointServing):
    request_model = ChatCompletionRequest

    def prepare(self, req: ChatCompletionRequest, principal: Principal, loaded: Any = None) -> Prepared:
        """The messages through the chat template with their tools; `response_format` as a constraint."""
        serving = self.serving
        serving.check_model(req.model)
        tools, choice, parallel = req.tool_setup()
        top = (req.top_logprobs or 0) if req.logprobs else 0
        ask = serving.conversation([m.stored() for m in req.messages], tools, choice, parallel, req.json_reply(),
                                   "response_format.json_schema.schema", max_tokens=req.max_completion_tokens or req.max_tokens,
                                   top_logprobs=top, meta=req.metadata, user=req.user, key_id=principal.key_id)
        return serving.prepared("chat", "chatcmpl", ask.prompt_ids, ask.ask, req, principal, ask.text)

    async def prepare_unlogged(self, text: str, principal: Principal, max_tokens: int) -> Prepared:
        """A one-message chat request served as `store: false` to its end (`ignore_eos`): the start's
        warm-up generation (server/edge/pipeline/readiness.py)."""
        req = ChatCompletionRequest(
            model=self.serving.model_name, messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens, store=False, ignore_eos=True,
        )
        return await self.serving.prepare(req, principal, self.prepare)

    def format(self, req: ChatCompletionRequest, prepared: Prepared) -> ChatFormat:
        return ChatFormat(self.serving, req, prepared)
