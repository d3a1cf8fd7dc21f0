"""What OpenAI's chat and completions responses share (server/edge/chat/serving.py,
server/edge/completions/serving.py): the head of every body and chunk (`id`, `object`, `created`, `model`,
liveloop's `policy_version`), `usage`, a stream's `data:` events ending in `[DONE]`, and the error
event of a stream whose status went out already. Which version sampled which tokens is the extra field
`version_spans`, `[{"start": 0, "end": 12, "version": 3}, ...]` over the response's token indexes
[start, end): always there in a whole response and in a stream's last chunk (the one with
`finish_reason`), one span when no swap happened (none for an empty response), more when a `keep` swap
continued the response under newer weights.

`n` > 1: each choice is its own generation and its own logged response, with its own id, rateable
alone: the body's `id` is the first choice's, and every choice says its own as `response_id` (with its
`policy_version` and `version_spans`), in a whole response and in a stream's first and last chunk of
that choice. `usage` counts the prompt once and every choice's tokens.

Text-only chunks are rendered from a template made once per choice (only the text is JSON-encoded).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from liveloop.server.edge.errors import error_body
from liveloop.server.edge.pipeline.serving import Piece, Prepared, Run, Serving
from liveloop.server.edge.pipeline.streaming import Format, json_text, spans

DONE = b"data: [DONE]\n\n"
_HOLE = "\u0000"  # stands for the text in a chunk template; the JSON of a real head never has it


def sse(obj: Any) -> bytes:
    return f"data: {json_text(obj)}\n\n".encode()


def usage(runs: list[Run]) -> dict:
    """OpenAI's usage: `prompt_tokens_details.cached_tokens` are the prompt tokens the engine's prefix
    cache held (vLLM with `[engine] prefix_caching`; 0 otherwise), a part of `prompt_tokens`."""
    n_prompt, n_out = len(runs[0].prepared.prompt_ids), sum(len(r.token_ids) for r in runs)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": runs[0].cached_tokens}}


class OpenAIFormat(Format):
    """The response bodies of one OpenAI endpoint: `whole`, and a stream's chunks (`first_chunk` per
    choice, `chunk` per piece, `final_chunk` per choice, with `usage_chunk` when
    `stream_options.include_usage`), then `[DONE]`."""

    object_name = ""
    chunk_name = ""

    def __init__(self, serving: Serving, req: Any, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        self.several = getattr(req, "n", 1) > 1
        self.wants_tokens = bool(req.return_token_ids or prepared.sampling.top_logprobs or self._logprobs_on())
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self._text_chunks: dict[int, Callable[[str], bytes]] = {}

    def choice(self, run: Run) -> dict:
        """One choice of a whole response."""
        raise NotImplementedError

    def chunk(self, run: Run, piece: Piece) -> dict:
        raise NotImplementedError

    def final_choice(self, run: Run) -> dict:
        raise NotImplementedError

    def whole(self, runs: list[Run]) -> dict:
        first = runs[0]
        body = {**self._head(first, self.object_name), "version_spans": spans(first),
                "choices": [self._own(run, self.choice(run)) for run in runs], "usage": usage(runs)}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def _own(self, run: Run, choice: dict) -> dict:
        """A choice naming its own response, version and spans (n > 1)."""
        if self.several:
            choice.update(response_id=run.prepared.response_id, policy_version=run.version, version_spans=spans(run))
        return choice

    # -- the stream, as `streaming.EndpointServing` writes it ---------------------------------------
    def opening(self, runs: list[Run]) -> bytes:
        # the role-only first chunks (chat) ride with the first text
        return b"".join(sse(first) for run in runs if (first := self.first_chunk(run)) is not None)

    def group(self, run: Run, pieces: list[Piece]) -> bytes:
        if self.wants_tokens:
            return b"".join(sse(self.chunk(run, piece)) for piece in pieces)
        index = run.prepared.choice_index
        if index not in self._text_chunks:
            self._text_chunks[index] = self.text_chunk_renderer(run)
        text = "".join(piece.text for piece in pieces)
        return self._text_chunks[index](text) if text else b""

    def error(self, status: int, message: str, code: str | None) -> bytes:
        return sse(error_body(status, message, code=code))

    def closing(self, runs: list[Run]) -> bytes:
        last = b"".join(sse(self.final_chunk(run)) for run in runs)
        if self.include_usage:
            last += sse(self.usage_chunk(runs))
        return last + DONE

    def final_chunk(self, run: Run) -> dict:
        choice = self._own(run, self.final_choice(run))
        return {**self._head(run, self.chunk_name), "version_spans": spans(run), "choices": [choice]}

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

    def usage_chunk(self, runs: list[Run]) -> dict:
        return {**self._head(runs[0], self.chunk_name), "choices": [], "usage": usage(runs)}

    def first_chunk(self, run: Run) -> dict | None:
        return None

    def text_piece(self, run: Run, text: str) -> Piece:
        return Piece(text, [], [], None, run.version)

    def text_chunk_renderer(self, run: Run) -> Callable[[str], bytes]:
        """text -> the SSE event `chunk` makes for a text-only piece of this run, byte for byte, with
        one JSON encoding of the text instead of the whole chunk (for a request that wants no tokens)."""
        template = sse(self.chunk(run, self.text_piece(run, _HOLE))).decode()
        before, after = template.split(json_text(_HOLE))
        head, tail = before.encode(), after.encode()
        return lambda text: head + json.dumps(text).encode() + tail
