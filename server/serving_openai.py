"""What OpenAI's chat and completions responses share (server/serving_chat.py,
server/serving_completions.py): the head of every body and chunk (`id`, `object`, `created`, `model`,
liveloop's `policy_version`), `usage`, a stream's `data:` events ending in `[DONE]`, and the error
event of a stream whose status went out already. Which version sampled which tokens is the extra field
`version_spans`, `[{"start": 0, "end": 12, "version": 3}, ...]` over the response's token indexes
[start, end): always there in a whole response and in a stream's last chunk (the one with
`finish_reason`), one span when no swap happened (none for an empty response), more when a `keep` swap
continued the response under newer weights.

Text-only chunks are rendered from a template made once per response (only the text is JSON-encoded).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from liveloop.server.errors import error_body
from liveloop.server.serving import Piece, Prepared, Run, Serving
from liveloop.server.streaming import Format, json_text, spans

DONE = b"data: [DONE]\n\n"
_HOLE = "\u0000"  # stands for the text in a chunk template; the JSON of a real head never has it


def sse(obj: Any) -> bytes:
    return f"data: {json_text(obj)}\n\n".encode()


def usage(run: Run) -> dict:
    n_prompt, n_out = len(run.prepared.prompt_ids), len(run.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


class OpenAIFormat(Format):
    """The response bodies of one OpenAI endpoint: `whole`, and a stream's chunks (`first_chunk`, `chunk`
    per piece, `final_chunk`, with `usage_chunk` when `stream_options.include_usage`), then `[DONE]`."""

    object_name = ""
    chunk_name = ""

    def __init__(self, serving: Serving, req: Any, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        self.wants_tokens = bool(req.return_token_ids or prepared.sampling.top_logprobs or self._logprobs_on())
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self._text_chunk: Callable[[str], bytes] | None = None

    def chunk(self, run: Run, piece: Piece) -> dict:
        raise NotImplementedError

    def final_chunk(self, run: Run) -> dict:
        raise NotImplementedError

    # -- the stream, as `streaming.EndpointServing` writes it ---------------------------------------
    def opening(self, run: Run) -> bytes:
        first = self.first_chunk(run)  # the role-only first chunk (chat) rides with the first text
        return b"" if first is None else sse(first)

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        if self.wants_tokens:
            return b"".join(sse(self.chunk(run, piece)) for piece in pieces)
        if self._text_chunk is None:
            self._text_chunk = self.text_chunk_renderer(run)
        text = "".join(piece.text for piece in pieces)
        return self._text_chunk(text) if text else b""

    def error(self, status: int, message: str, code: str | None) -> bytes:
        return sse(error_body(status, message, code=code))

    def closing(self, run: Run) -> bytes:
        last = sse(self.final_chunk(run))
        if self.include_usage:
            last += sse(self.usage_chunk(run))
        return last + DONE

    def _logprobs_on(self) -> bool:
        return False

    def _head(self, run: Run, obj: str) -> dict:
        return {
            "id": self.prepared.response_id,
            "object": obj,
            "created": self.prepared.created,
            "model": self.serving.model_name,
            "policy_version": run.version,
        }

    def usage_chunk(self, run: Run) -> dict:
        return {**self._head(run, self.chunk_name), "choices": [], "usage": usage(run)}

    def first_chunk(self, run: Run) -> dict | None:
        return None

    def text_piece(self, run: Run, text: str) -> Piece:
        return Piece(text, [], [], None, run.version)

    def text_chunk_renderer(self, run: Run) -> Callable[[str], bytes]:
        """text -> the SSE event `chunk` makes for a text-only piece, byte for byte, with one JSON
        encoding of the text instead of the whole chunk (for a request that wants no tokens)."""
        template = sse(self.chunk(run, self.text_piece(run, _HOLE))).decode()
        before, after = template.split(json_text(_HOLE))
        head, tail = before.encode(), after.encode()
        return lambda text: head + json.dumps(text).encode() + tail
