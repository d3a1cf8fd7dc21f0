"""The ids this server gives responses: `chatcmpl-`, `cmpl-`, `msg_` or `resp_` then 32 random hex
digits, and `-i` after a request's first for its choice i. `issued` says whether a string has that
shape: a deletion leaves a tombstone for an id not stored yet only when it could be one of ours."""

from __future__ import annotations

import re
import uuid

_UNDERSCORE = ("msg", "resp")  # the Anthropic and Responses APIs' style
_ISSUED = re.compile(r"(?:chatcmpl-|cmpl-|msg_|resp_)[0-9a-f]{32}(?:-[1-9][0-9]{0,3})?")


def new_response_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}" if prefix in _UNDERSCORE else f"{prefix}-{uuid.uuid4().hex}"


def issued(response_id: str) -> bool:
    return _ISSUED.fullmatch(response_id) is not None
