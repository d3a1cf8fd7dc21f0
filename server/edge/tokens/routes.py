"""vLLM's tokenizer routes, which clients written for vLLM call: POST /tokenize (a prompt, or chat
messages rendered by the chat template with their tools) and POST /detokenize, for user keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import tokens as handler
from liveloop.server.edge.tokens.serving import ServingTokens

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request, principal: Principal = Depends(user), h: ServingTokens = Depends(handler)) -> dict:
    return await h.tokenize(request, principal)


@router.post("/detokenize")
async def detokenize(request: Request, principal: Principal = Depends(user), h: ServingTokens = Depends(handler)) -> dict:
    return await h.detokenize(request, principal)
