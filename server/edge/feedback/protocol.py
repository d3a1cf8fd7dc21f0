"""liveloop's feedback request (POST /v1/feedback): a thumbs up or down for a response id from any
generating endpoint (chat, completions, Anthropic messages), or for a client's whole session (its
episode's latest turn: server/edge/sessions.py), named by exactly one of `response_id` and `session_id`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.protocol import Text, _Strict
from liveloop.server.edge.sessions import MAX_SESSION_CHARS


class FeedbackRequest(_Strict):
    response_id: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    session_id: Annotated[Text, Field(min_length=1, max_length=MAX_SESSION_CHARS)] | None = None
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

    @model_validator(mode="after")
    def _one_target(self) -> "FeedbackRequest":
        if (self.response_id is None) == (self.session_id is None):
            raise ValueError("name exactly one of response_id and session_id")
        return self
