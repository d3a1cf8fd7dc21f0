"""OpenAI completions (POST /v1/completions): the response and its stream's chunks (`text_completion`),
logprobs in the legacy form (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). A stream's
`text_offset`s are offsets into the whole completion, continuing across its chunks, exactly the ones
the whole response carries (`echo` is not served, so the prompt never counts)."""

from __future__ import annotations

from typing import Any

from liveloop.server.edge.completions.protocol import CompletionRequest
from liveloop.server.edge.pipeline.serving import Ask, InvalidRequest, Piece, Prepared, Run
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.formats.openai import OpenAIFormat
from liveloop.server.edge.pipeline.streaming import EndpointServing


class CompletionFormat(OpenAIFormat):
    object_name = "text_completion"
    chunk_name = "text_completion"

    def _logprobs_on(self) -> bool:
        return self.req.logprobs is not None

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._offsets: dict[int, int] = {}  # per choice: where its next streamed chunk's first token starts
        self._prompt_sent: set[int] = set()  # choices whose prompt ids a stream has carried (return_token_ids)

    def _logprobs(self, ids: list[int], lps: list[float], top: list | None, offset: int) -> tuple[dict | None, int]:
        """The logprobs of these tokens, their `text_offset`s starting at `offset`; and the offset after them."""
        if self.req.logprobs is None:
            return None, offset
        tok = self.serving.tokenizer
        tokens = [tok.decode([t]) for t in ids]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        tops = None
        if self.req.logprobs:
            tops = [{tok.decode([a]): alp for a, alp in (top[i] if top and i < len(top) else [])} for i in range(len(ids))]
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, pos

    def choice(self, run: Run) -> dict:
        choice: dict[str, Any] = {
            "index": run.prepared.choice_index,
            "text": run.text,
            "logprobs": self._logprobs(run.token_ids, run.logprobs, run.top_logprobs, 0)[0],
            "finish_reason": run.finish_reason,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = run.token_ids
        return choice

    def chunk(self, run: Run, piece: Piece) -> dict:
        """One piece's chunk; called once per piece, in order (its offsets continue the previous chunk's)."""
        index = run.prepared.choice_index
        logprobs, self._offsets[index] = self._logprobs(piece.token_ids, piece.logprobs, piece.top_logprobs, self._offsets.get(index, 0))
        choice: dict[str, Any] = {
            "index": index,
            "text": piece.text,
            "logprobs": logprobs,
            "finish_reason": None,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = piece.token_ids
            if index not in self._prompt_sent:  # on a choice's first chunk, as vLLM's stream carries it
                self._prompt_sent.add(index)
                choice["prompt_token_ids"] = list(run.prepared.prompt_ids)
        return {**self._head(run, self.chunk_name), "choices": [choice]}

    def final_choice(self, run: Run) -> dict:
        return {"index": run.prepared.choice_index, "text": "", "logprobs": None, "finish_reason": run.finish_reason}


class ServingCompletions(EndpointServing):
    request_model = CompletionRequest

    def prepare(self, req: CompletionRequest, principal: Principal, loaded: Any = None) -> Prepared:
        """A text prompt tokenized (special tokens added), or the token ids as sent (each in the vocabulary)."""
        serving = self.serving
        serving.check_model(req.model)
        if isinstance(req.prompt, str):
            prompt_ids = serving.tokenizer(req.prompt, add_special_tokens=True)["input_ids"]
        else:
            prompt_ids = list(req.prompt)
            if max(prompt_ids) >= serving.vocab_size:
                raise InvalidRequest(f"prompt: token ids must be < {serving.vocab_size}", "prompt")
        ask = Ask(max_tokens=req.max_tokens, top_logprobs=req.logprobs or 0, meta=req.metadata, user=req.user)
        return serving.prepared("completion", "cmpl", prompt_ids, ask, req, principal)

    def format(self, req: CompletionRequest, prepared: Prepared) -> CompletionFormat:
        return CompletionFormat(self.serving, req, prepared)
