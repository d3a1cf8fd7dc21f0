"""Pydantic models of the HTTP edge (OpenAI-compatible requests, liveloop's feedback). Only here:
everything behind the edge speaks typed dataclasses.

Every number and length a request carries is bounded here by what the engines and both stores can
hold (seeds are 64-bit signed, counts 32-bit, floats finite), so a bad value is a 400 naming the
field before anything runs, never an error after generation."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

Stop = str | list[str] | None
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")  # PostgreSQL text cannot hold them
    return v


Text = Annotated[str, AfterValidator(_no_nul)]  # a string the store keeps


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: Annotated[str, Field(max_length=64)] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: Stop = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[Text, Text] | None = Field(default=None, description="tags stored with the response")
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    return_token_ids: bool = Field(default=False, description="extension: include prompt/completion token ids")
    store: bool = Field(default=True, description="false: serve the request and log nothing (no row, no training)")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Stop) -> Stop:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop sequences must be at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("metadata")
    @classmethod
    def _meta(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
            raise ValueError("metadata: at most 16 keys, keys <= 64 and values <= 512 characters")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        if len(v) > MAX_MESSAGES:
            raise ValueError(f"at most {MAX_MESSAGES} messages")
        return v

    @model_validator(mode="after")
    def _top(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False
    suffix: None = None

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


class FeedbackRequest(_Strict):
    response_id: Annotated[Text, Field(min_length=1, max_length=64)]
    reward: int | str
    comment: Annotated[Text, Field(max_length=4096)] | None = None

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: int | str) -> int:
        if isinstance(v, bool):
            raise ValueError("reward must be 0, 1, 'up' or 'down'")
        table = {0: 0, 1: 1, "up": 1, "down": 0, "0": 0, "1": 1}
        if v not in table:
            raise ValueError("reward must be 0, 1, 'up' or 'down'")
        return table[v]


class SwapRequest(_Strict):
    path: Annotated[Text, Field(min_length=1, max_length=4096)]
    note: Annotated[Text, Field(max_length=1000)] | None = None


Segment = Annotated[Text, Field(min_length=1, max_length=256)]  # an adapter segment's name (`[learner] segments`)


class RollbackRequest(_Strict):
    version: Annotated[int, Field(ge=0, le=INT32_MAX)]
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # move this segment's adapter lineage only (to a base version: no adapter)
    # the version the operator saw serving (that lineage): 409 serving_changed if another serves now
    expect_serving: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class PauseRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # pause or resume this segment's lane only


class ForgetRequest(_Strict):
    weights: bool = False  # also roll the key's training out of the weights (server/forgetting.py)
    dry_run: bool = False  # with weights: only report what it would do

    @model_validator(mode="after")
    def _dry_run_needs_weights(self) -> "ForgetRequest":
        if self.dry_run and not self.weights:
            raise ValueError("dry_run: only a forget with weights: true has a plan to report")
        return self


class QuarantineRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None
