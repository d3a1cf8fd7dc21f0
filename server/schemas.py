"""Pydantic models of the HTTP edge, one protocol module per endpoint (as vLLM's frontend splits
them): `protocol_chat` (OpenAI chat completions), `protocol_completions`, `protocol_messages`
(Anthropic messages), `protocol_feedback`, `protocol_admin`, over what they share in
`protocol_base`. Only there: everything behind the edge speaks typed dataclasses. This module names
them all for the code that imports them from one place."""

from liveloop.server.protocol_admin import ForgetRequest, PauseRequest, QuarantineRequest, RollbackRequest, Segment, SwapRequest
from liveloop.server.protocol_base import INT32_MAX, INT64_MAX, INT64_MIN, MAX_MESSAGES, MAX_STOP_CHARS, Stop, StreamOptions, Text
from liveloop.server.protocol_chat import ChatCompletionRequest, ChatMessage, TextPart
from liveloop.server.protocol_completions import CompletionRequest
from liveloop.server.protocol_feedback import FeedbackRequest
from liveloop.server.protocol_messages import MessagesRequest

__all__ = [
    "INT32_MAX", "INT64_MAX", "INT64_MIN", "MAX_MESSAGES", "MAX_STOP_CHARS",
    "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "FeedbackRequest", "ForgetRequest", "MessagesRequest",
    "PauseRequest", "QuarantineRequest", "RollbackRequest", "Segment", "Stop", "StreamOptions", "SwapRequest", "Text", "TextPart",
]
