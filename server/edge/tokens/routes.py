"""vLLM's tokenizer routes, which clients written for vLLM call: POST /tokenize (a prompt, or chat
messages rendered by the chat template with their tools) and POST /detokenize, for user keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.dependencies import Parts, parts
from liveloop.server.edge.tokens.protocol import DetokenizeRequest, TokenizeRequest
from liveloop.server.edge.pipeline.serving import UnknownModel

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request, principal: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    serving = p.serving
    serving.admission.check_rate("chat", principal.key_id)
    tokens = await serving.tokenize(await parse_body(request, TokenizeRequest))
    return {"count": len(tokens), "max_model_len": serving.max_model_len, "tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request, principal: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    serving = p.serving
    serving.admission.check_rate("chat", principal.key_id)
    req = await parse_body(request, DetokenizeRequest)
    if req.model is not None and req.model != serving.model_name:
        raise UnknownModel(req.model)
    return {"prompt": serving.detokenize(req.tokens)}
