"""Anthropic messages (POST /v1/messages): the `message` object and its stream of named events, as
the official `anthropic` client reads them.

A whole response: `{"id": "msg_...", "type": "message", "role": "assistant", "content": [{"type":
"text", "text": ...}], "model", "stop_reason", "stop_sequence", "usage": {"input_tokens",
"output_tokens"}}` plus liveloop's `policy_version`, `version_spans` (as on chat completions) and
`finish_reason` (liveloop's own: "abort" has no Anthropic stop reason and reads "end_turn"). The id is
the response id `/v1/feedback` rates. `stop_reason`: "end_turn" (the model ended it), "max_tokens",
"stop_sequence" (with the one in `stop_sequence`).

A stream: `message_start` (the message with empty content and the admitted version),
`content_block_start`, `ping`, one `content_block_delta` (`text_delta`) per write, `content_block_stop`,
`message_delta` (stop reason, output tokens, `version_spans`), `message_stop`; the last four only once
the response is logged. A failure after the status went out is an `error` event in Anthropic's error
shape (server/errors.py)."""

from __future__ import annotations

import json

from liveloop.server.errors import anthropic_error_body
from liveloop.server.protocol_messages import MessagesRequest
from liveloop.server.serving import Piece, Prepared, Run, Serving
from liveloop.server.streaming import EndpointServing, Format, json_text, spans

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
_HOLE = "\u0000"  # stands for the text in the delta template


def event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json_text(data)}\n\n".encode()


class MessagesFormat(Format):
    def __init__(self, serving: Serving, req: MessagesRequest, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        before, after = event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": _HOLE}}).decode().split(json.dumps(_HOLE))
        self._delta_head, self._delta_tail = before.encode(), after.encode()

    def _stop(self, run: Run) -> tuple[str, str | None]:
        if run.finish_reason == "stop" and run.stop_sequence is not None:
            return "stop_sequence", run.stop_sequence
        return STOP_REASONS.get(run.finish_reason or "", "end_turn"), None

    def _message(self, run: Run, text: str | None, stop_reason: str | None, stop_sequence: str | None, output_tokens: int) -> dict:
        return {
            "id": self.prepared.response_id,
            "type": "message",
            "role": "assistant",
            "content": [] if text is None else [{"type": "text", "text": text}],
            "model": self.serving.model_name,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": len(self.prepared.prompt_ids), "output_tokens": output_tokens},
            "policy_version": run.version,
        }

    def whole(self, run: Run) -> dict:
        reason, sequence = self._stop(run)
        body = self._message(run, run.text, reason, sequence, len(run.token_ids))
        return {**body, "version_spans": spans(run), "finish_reason": run.finish_reason}

    def opening(self, run: Run) -> bytes:
        return (
            event("message_start", {"type": "message_start", "message": self._message(run, None, None, None, 0)})
            + event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            + event("ping", {"type": "ping"})
        )

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        text = "".join(piece.text for piece in pieces)
        return self._delta_head + json.dumps(text).encode() + self._delta_tail if text else b""

    def error(self, status: int, message: str, code: str | None) -> bytes:
        return event("error", anthropic_error_body(status, message))

    def closing(self, run: Run) -> bytes:
        reason, sequence = self._stop(run)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": len(run.token_ids)},
            "policy_version": run.version,
            "version_spans": spans(run),
            "finish_reason": run.finish_reason,
        }
        return (
            event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event("message_delta", delta)
            + event("message_stop", {"type": "message_stop"})
        )


class ServingMessages(EndpointServing):
    request_model = MessagesRequest

    def format(self, req: MessagesRequest, prepared: Prepared) -> MessagesFormat:
        return MessagesFormat(self.serving, req, prepared)
