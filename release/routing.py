"""The canary routing rule: which requests a canary candidate serves.

A request is routed by its API key's id (`[release] canary_by = "key"`, the default): every request of
one key goes the same way, whatever it sends, so a key cannot choose to be in the canary (or out of
it) by trying `user` strings. With `canary_by = "user"` the OpenAI `user` field (Anthropic's
`metadata.user_id`) is hashed under the key id, `key:<id>/user:<user>`: one trusted app key fronting
many people spreads them over both sides, and no key's strings can stand for another key's users.
The release gate and the guard count one vote per key either way (release/decision.py).

`bucket` maps a routing string to a point in [0, 1) by sha256, the same in every process, replica and
restart (Python's `hash` is salted per process); `in_canary` sends the strings whose point lies below
the canary fraction to the candidate. So a key (or a user) sees one version consistently while a
candidate is in canary, the same ones try every next candidate (a promotion only moves them forward,
from the candidate they saw to the version everyone now sees), and the share of keys (users), not of
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


def user_key(user: str | None, api_key_id: str, by: str = "key") -> str:
    """What a request is routed by: `by` "key", its API key id alone; "user", its `user` field (when
    given, non-empty) under its key id."""
    if by == "user" and user:
        return f"key:{api_key_id}/user:{user}"
    return f"key:{api_key_id}"
