"""vLLM's tokenizer routes' requests (POST /tokenize, POST /detokenize), as clients written for vLLM
send them: a `prompt` (tokenized as /v1/completions does) or chat `messages` (rendered as
/v1/chat/completions does, tools and all), and token ids back to text."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from liveloop.server.edge.protocol import MAX_MESSAGES, MAX_TOOLS, Text, TokenId, _Strict
from liveloop.server.edge.chat.protocol import ChatMessage, ChatTool

class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    tools: Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chars_param: ClassVar[str] = "prompt"

    @model_validator(mode="after")
    def _one(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` and `messages`")
        return self

    def chars(self) -> int:
        return len(self.prompt) if self.prompt is not None else sum(m.chars() for m in self.messages or ())


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: Annotated[list[TokenId], Field(max_length=1 << 16)]
