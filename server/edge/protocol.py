"""What every endpoint's request model shares (server/edge/<endpoint>/protocol.py, one per endpoint): the
strict base (unknown fields and wrong types are 400s), the bounds of what the engines and both stores
can hold (seeds are 64-bit signed, counts 32-bit, floats finite, no NUL in stored text), stop strings,
and OpenAI's sampling fields (chat and completions)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

Stop = str | list[str] | None
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_STOP_CHARS = 256
MAX_STOPS = 4
MAX_MESSAGES = 1024


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")  # PostgreSQL text cannot hold them
    return v


Text = Annotated[str, AfterValidator(_no_nul)]  # a string the store keeps
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(gt=0, le=INT32_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def check_stops(stops: list[str]) -> None:
    """Raises ValueError for a stop list the text stream will not take."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences")
    if any(not s for s in stops):
        raise ValueError("stop sequences must be non-empty")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"stop sequences must be at most {MAX_STOP_CHARS} characters")


def check_metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds on request metadata (the tags stored with a response)."""
    if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
        raise ValueError("metadata: at most 16 keys, keys <= 64 and values <= 512 characters")
    return v


class StreamOptions(_Strict):
    include_usage: bool = False



MAX_N = 16  # choices one request may ask for (each its own generation, response id and rating)
MAX_TOOLS = 128  # tools one request may offer, calls one message may hold
# a function's (OpenAI) or tool's (Anthropic) name, and a response format's: both APIs' rule
Name = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class SamplingExtensions(_Strict):
    """vLLM's sampling extensions, which clients written for vLLM send (its benchmark client sends
    `ignore_eos` on every request): the same names and meanings on every endpoint that takes them."""

    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = Field(default=None, description="extension: sample among the k likeliest tokens (-1 or 0: all)")
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(default=None, description="extension: drop tokens below min_p times the likeliest")
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = Field(default=None, description="extension: vLLM's repetition penalty (1: off)")
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = Field(default=None, description="extension: no stop token before this many tokens")
    ignore_eos: bool = Field(default=False, description="extension: the model's end-of-sequence token does not end the reply")
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = Field(default=None, description="extension: more token ids that end the reply")


class _Sampling(SamplingExtensions):
    model: str
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: Stop = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[Text, Text] | None = Field(default=None, description="tags stored with the response")
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    return_token_ids: bool = Field(default=False, description="extension: include prompt/completion token ids")
    store: bool = Field(default=True, description="false: serve the request and log nothing (no row, no training)")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Stop) -> Stop:
        check_stops([v] if isinstance(v, str) else (v or []))
        return v

    _meta = field_validator("metadata")(lambda cls, v: check_metadata(v))

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
