"""vLLM's tokenizer endpoints' handler: a prompt's token ids as /v1/completions makes them, or chat
messages' (tools included) as /v1/chat/completions renders them, and token ids back to text; the
rendering and tokenizing on the serving pipeline's prompt thread."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from liveloop.server.edge.body import parse_body
from liveloop.server.edge.formats.tools import ToolChoice
from liveloop.server.edge.pipeline.serving import InvalidRequest, Serving, UnknownModel
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.tokens.protocol import DetokenizeRequest, TokenizeRequest


class ServingTokens:
    """POST /tokenize and /detokenize, counted in a key's chat rate."""

    rate_bucket = "chat"

    def __init__(self, serving: Serving):
        self.serving = serving

    async def tokenize(self, request: Request, principal: Principal) -> dict[str, Any]:
        serving = self.serving
        serving.admission.check_rate(self.rate_bucket, principal.key_id)
        req = await parse_body(request, TokenizeRequest)
        if req.model is not None:
            serving.check_model(req.model)
        serving.check_chars(req)

        def work() -> list[int]:
            if req.prompt is not None:
                return serving.tokenizer(req.prompt, add_special_tokens=req.add_special_tokens)["input_ids"]
            tools = [t.tool() for t in req.tools or ()]
            choice = ToolChoice("auto" if tools else "none")
            return serving.render_chat([m.stored() for m in req.messages or ()], tools, choice, True, req.add_generation_prompt)[1]

        tokens = await serving.on_prompt_thread(work, principal.key_id)
        return {"count": len(tokens), "max_model_len": serving.max_model_len, "tokens": tokens}

    async def detokenize(self, request: Request, principal: Principal) -> dict[str, Any]:
        serving = self.serving
        serving.admission.check_rate(self.rate_bucket, principal.key_id)
        req = await parse_body(request, DetokenizeRequest)
        if req.model is not None and req.model != serving.model_name:
            raise UnknownModel(req.model)
        if any(t >= serving.vocab_size for t in req.tokens):
            raise InvalidRequest(f"tokens: token ids must be < {serving.vocab_size}", "tokens")
        return {"prompt": await serving.on_prompt_thread(lambda: serving.tokenizer.decode(req.tokens), principal.key_id)}  # never on the event loop
