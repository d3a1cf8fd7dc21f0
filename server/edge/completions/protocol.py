"""OpenAI completions' request (POST /v1/completions); the response bodies are made by
server/edge/completions/serving.py."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from liveloop.server.edge.protocol import INT32_MAX, _Sampling


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False
    suffix: None = None
    chars_param: ClassVar[str] = "prompt"

    def chars(self) -> int:
        """A text prompt's length (token ids are bounded by the context, not counted here)."""
        return len(self.prompt) if isinstance(self.prompt, str) else 0

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], str):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
                return v[0]
            if any(t < 0 or t > INT32_MAX for t in v):
                raise ValueError(f"token ids must be in 0..{INT32_MAX}")
        elif v == "":
            raise ValueError("prompt must not be empty")
        return v
