"""OpenAI chat completions (POST /v1/chat/completions): the response and its stream's chunks
(`chat.completion`, `chat.completion.chunk`: a role-only first chunk, content deltas, the last chunk
with `finish_reason` and `version_spans`), logprobs as `content` entries with their bytes."""

from __future__ import annotations

from typing import Any

from liveloop.server.protocol_chat import ChatCompletionRequest
from liveloop.server.serving import Piece, Prepared, Run
from liveloop.server.serving_openai import OpenAIFormat, usage
from liveloop.server.streaming import EndpointServing, spans
from liveloop.server.text import token_bytes


class ChatFormat(OpenAIFormat):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

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

    def whole(self, run: Run) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": run.text},
            "logprobs": self._content_logprobs(run.token_ids, run.logprobs, run.top_logprobs),
            "finish_reason": run.finish_reason,
        }
        body = {**self._head(run, self.object_name), "version_spans": spans(run), "choices": [choice], "usage": usage(run)}
        if self.req.return_token_ids:
            choice["token_ids"] = run.token_ids
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def first_chunk(self, run: Run) -> dict:
        choice: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        body = {**self._head(run, self.chunk_name), "choices": [choice]}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def chunk(self, run: Run, piece: Piece) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": piece.text},
            "logprobs": self._content_logprobs(piece.token_ids, piece.logprobs, piece.top_logprobs),
            "finish_reason": None,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = piece.token_ids
        return {**self._head(run, self.chunk_name), "choices": [choice]}

    def final_chunk(self, run: Run) -> dict:
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": run.finish_reason}
        return {**self._head(run, self.chunk_name), "version_spans": spans(run), "choices": [choice]}


class ServingChat(EndpointServing):
    request_model = ChatCompletionRequest

    def format(self, req: ChatCompletionRequest, prepared: Prepared) -> ChatFormat:
        return ChatFormat(self.serving, req, prepared)
