"""The canary routing rule: which users a canary candidate serves.

A user is the OpenAI `user` field of the request when the client sends one (the end user of a chat
app), else the API key's id. `bucket` maps a user to a point in [0, 1) by sha256, the same in every
process, replica and restart (Python's `hash` is salted per process); `in_canary` sends the users whose
point lies below the canary fraction to the candidate. So a user sees one version consistently while a
candidate is in canary, the same users try every next candidate (a promotion only moves them forward,
from the candidate they saw to the version everyone now sees), and the share of users, not of
requests, is the configured fraction.
"""

from __future__ import annotations

import hashlib

_SPAN = float(1 << 64)


def bucket(user_key: str) -> float:
    """The user's stable point in [0, 1): the first 8 bytes of sha256(user_key), big-endian, / 2**64."""
    digest = hashlib.sha256(user_key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / _SPAN


def in_canary(user_key: str, fraction: float) -> bool:
    """Whether `user_key` is among the `fraction` of users a canary candidate serves."""
    return bucket(user_key) < fraction


def user_key(user: str | None, api_key_id: str) -> str:
    """Who a request is routed by: its `user` field when given (non-empty), else its API key id. The two
    namespaces are kept apart so a `user` string can never stand for another client's key."""
    return f"user:{user}" if user else f"key:{api_key_id}"
