"""How a turn finds the turn it continues, when the client names none: link keys (docs/design.md,
"Episodes").

A stateless client (Chat Completions, Messages, a completion agent with its own template) resends the
whole conversation, so its next prompt starts with the earlier turn's prompt and sampled tokens, exactly,
then the tokens between the turns (the template's glue, a tool result, the user's next message). Each
stored response keeps one hash, of its prompt and sampled tokens without a final stop token
(`LinkKeys.own`: a chat template closes a turn with its own end marker, which may or may not be the token
the model stopped on), and each new prompt offers the hashes of its prefixes that end right before a
stop token (`LinkKeys.candidates`: the only places an earlier turn can have ended, one or two per message,
not one per token). The store looks them up in one indexed query for the same key and keeps the longest
match after comparing the tokens themselves: a hash only proposes.

Pure: tokens in, integers out (the server computes them while it builds the record)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

MAX_CANDIDATES = 4096  # the latest this many boundaries of a prompt are offered (a 1,000-turn agent's)


def _signed(digest: bytes) -> int:
    return int.from_bytes(digest, "little", signed=True)  # fits a BIGINT column


def _bytes(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def sequence_hash(ids: Sequence[int]) -> int:
    """The 64-bit hash of a token sequence (the same function the candidates use)."""
    return _signed(hashlib.blake2b(_bytes(ids), digest_size=8).digest())


def trimmed(response_ids: Sequence[int], stop_ids: Iterable[int]) -> int:
    """How many of a response's sampled tokens a resent conversation carries for certain: all of them,
    or all but a final stop token (the template writes its own end marker there)."""
    n = len(response_ids)
    return n - 1 if n and int(response_ids[-1]) in set(stop_ids) else n


@dataclass(frozen=True)
class LinkKeys:
    own: int  # hash of prompt + sampled tokens (a final stop token left out)
    candidates: tuple[tuple[int, int], ...]  # (prefix length, hash of the prompt's first that many tokens)
    text: int | None = None  # hash of the prompt's text + those sampled tokens' text (server/edge/pipeline/splicing.py)

    @classmethod
    def of(cls, prompt_ids: Sequence[int], response_ids: Sequence[int], stop_ids: Iterable[int], text: int | None = None) -> "LinkKeys":
        stops = {int(s) for s in stop_ids}
        prompt = np.asarray(prompt_ids, dtype="<i4")
        ends = [int(i) for i in np.flatnonzero(np.isin(prompt, list(stops))) if i > 0][-MAX_CANDIDATES:]
        h = hashlib.blake2b(digest_size=8)
        at, candidates = 0, []
        for end in ends:  # one pass over the prompt: the hasher's state is copied at each boundary
            h.update(prompt[at:end].tobytes())
            at = end
            candidates.append((end, _signed(h.copy().digest())))
        h.update(prompt[at:].tobytes())
        h.update(_bytes(response_ids[: trimmed(response_ids, stops)]))
        return cls(_signed(h.digest()), tuple(candidates), text)



EPISODE_KEY = "episode_id"  # the request metadata key a client names its episode with


def episode_tag(metadata: dict | None) -> str | None:
    """What the store indexes of a request's `metadata.episode_id`: a fixed-length digest of it (any
    text a client sends fits the column, and equal ids stay equal)."""
    value = (metadata or {}).get(EPISODE_KEY)
    if not isinstance(value, str) or not value:
        return None
    return session_tag(value)


def session_tag(session_id: str) -> str:
    """The episode tag of a client's session id (server/edge/sessions.py): the same digest as an equal
    `metadata.episode_id`'s, so POST /v1/feedback finds a session's turns by either."""
    return hashlib.blake2b(session_id.encode(), digest_size=16).hexdigest()


def text_hash(text: str) -> int:
    """The 64-bit hash of a text (its UTF-8 bytes), as `text_candidates` computes its prefixes'."""
    return _signed(hashlib.blake2b(text.encode(), digest_size=8).digest())


def text_candidates(text: str, markers: Iterable[str]) -> list[tuple[int, int]]:
    """(position, hash of text[:position]) at every place a stop token's text starts in `text` (the
    latest MAX_CANDIDATES), in order: where an earlier turn's text can have ended."""
    ends = sorted({m.start() for marker in markers if marker for m in re.finditer(re.escape(marker), text)} - {0})[-MAX_CANDIDATES:]
    h = hashlib.blake2b(digest_size=8)
    at, out = 0, []
    for end in ends:
        h.update(text[at:end].encode())
        at = end
        out.append((end, _signed(h.copy().digest())))
    return out
