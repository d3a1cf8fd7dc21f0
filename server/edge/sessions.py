"""Which client session a request belongs to, and whether it is a turn of that session's episode or a
side call (docs/design.md, "Episodes"; docs/api.md, "Rating a whole agent session").

A session is an episode: the store tags each turn with a digest of the session's id
(store/linking.py `session_tag`), so a session's turns link into one episode even where the resent
history does not carry the earlier turn's tokens (a compacted history); token-prefix links still
decide where they do. Read, first found wins:
  - the request's `metadata.episode_id` (any client);
  - Claude Code: the `X-Claude-Code-Session-Id` header, else `metadata.user_id` (a JSON string) with
    its `session_id`; a sub-agent's requests (`x-claude-code-agent-id`) are an episode of their own;
  - Codex: `client_metadata.thread_id` / `session_id`, else the `thread-id` / `session-id` headers or
    `x-codex-turn-metadata`'s; a thread is an episode (a sub-agent's thread has its own id).
A side call is stored but stitched into no episode (no tag, no link keys): Codex's
`x-codex-turn-metadata.request_kind` other than "turn" (its compaction); Claude Code's
`x-claude-code-request-class` other than main / subagent / workflow (sent only under
CLAUDE_CODE_GATEWAY_HINT_HEADERS=1), a memory pass (`x-claude-code-auxiliary-type`), and, without
those headers, a request with no tools (its tool-free helpers: titles, summaries), `max_tokens` 1
(quota and model probes) or a last user message that is its summary request (its compaction, which
offers the session's tools to keep the prompt cache). Pure: headers and the request's fields in, a
`ClientSession` out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from liveloop.store.linking import session_tag

MAX_SESSION_CHARS = 512  # a longer id is no session (the store keeps its digest; a client's ids are ~40)
CLAUDE_TURN_CLASSES = frozenset({"main", "subagent", "workflow"})
# Claude Code's compaction prompt opens so in each of its variants (the conversation so far, this
# conversation, the recent messages), after a "CRITICAL: Respond with TEXT ONLY" preamble
CLAUDE_SUMMARY_REQUEST = "Your task is to create a detailed summary of "
SUMMARY_SCAN_CHARS = 4096  # how far into each text block of the last user message the prompt is looked for


@dataclass(frozen=True)
class Asked:
    """What of a request's body the reading looks at."""

    metadata: Mapping[str, Any] | None = None
    client_metadata: Mapping[str, Any] | None = None
    tools: int = 0  # how many tools it offers
    max_tokens: int | None = None
    summary_request: bool = False  # its last user message asks for Claude Code's compaction summary

    @classmethod
    def of_body(cls, body: Mapping[str, Any]) -> "Asked":
        """From a request's JSON body (any endpoint's field names)."""
        tokens = next((body[k] for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if body.get(k) is not None), None)
        meta, client = body.get("metadata"), body.get("client_metadata")
        return cls(meta if isinstance(meta, Mapping) else None, client if isinstance(client, Mapping) else None,
                   len(body.get("tools") or ()), tokens if isinstance(tokens, int) else None,
                   _asks_for_summary(body.get("messages")))

    @classmethod
    def of_request(cls, req: Any) -> "Asked":
        """From a parsed request model (fields it lacks read as absent)."""
        meta = getattr(req, "metadata", None)
        if meta is not None and not isinstance(meta, Mapping):
            meta = meta.model_dump(exclude_none=True)  # Anthropic's metadata is a model
        fields = {k: getattr(req, k, None) for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")}
        return cls.of_body({"metadata": meta, "client_metadata": getattr(req, "client_metadata", None),
                            "tools": getattr(req, "tools", None), "messages": getattr(req, "messages", None), **fields})


def _field(item: Any, name: str) -> Any:
    """A field of a JSON object or of a parsed model."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _asks_for_summary(messages: Any) -> bool:
    """Whether the last message is a user's that carries Claude Code's summary request."""
    if not isinstance(messages, list) or not messages or _field(messages[-1], "role") != "user":
        return False
    content = _field(messages[-1], "content")
    blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
    texts = (b if isinstance(b, str) else _field(b, "text") for b in blocks)
    return any(isinstance(t, str) and CLAUDE_SUMMARY_REQUEST in t[:SUMMARY_SCAN_CHARS] for t in texts)


@dataclass(frozen=True)
class ClientSession:
    id: str  # what POST /v1/feedback's `session_id` names
    client: str  # "metadata" | "claude-code" | "codex"
    side: str | None = None  # why it is a side call (None: a turn of the session's episode)

    @property
    def tag(self) -> str | None:
        """The episode tag the stored response gets: None for a side call."""
        return None if self.side else session_tag(self.id)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS else None


def _json(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, str) or not value.startswith("{"):
        return {}
    try:
        out = json.loads(value)
    except ValueError:
        return {}
    return out if isinstance(out, Mapping) else {}


def read_session(headers: Mapping[str, str], asked: Asked) -> ClientSession | None:
    """The session a request belongs to (None: none named), and whether it is a side call."""
    h = {k.lower(): v for k, v in headers.items()}
    named = _text((asked.metadata or {}).get("episode_id"))
    if named is not None:
        return ClientSession(named, "metadata")
    claude = _text(h.get("x-claude-code-session-id")) or _text(_json((asked.metadata or {}).get("user_id")).get("session_id"))
    if claude is not None:
        agent = _text(h.get("x-claude-code-agent-id"))
        return ClientSession(claude if agent is None else f"{claude}/agent:{agent}", "claude-code", _claude_side(h, asked))
    turn = _json(h.get("x-codex-turn-metadata"))
    client = asked.client_metadata or {}
    codex = next(filter(None, map(_text, (client.get("thread_id"), h.get("thread-id"), turn.get("thread_id"),
                                          client.get("session_id"), h.get("session-id"), turn.get("session_id")))), None)
    if codex is not None:
        kind = turn.get("request_kind") or _json(client.get("x-codex-turn-metadata")).get("request_kind")
        return ClientSession(codex, "codex", None if kind in (None, "turn") else f"codex:{kind}")
    return None


def _claude_side(h: Mapping[str, str], asked: Asked) -> str | None:
    """Why a Claude Code request is not a turn of its session (None: it is one)."""
    if h.get("x-claude-code-auxiliary-type"):
        return f"claude-code:{h['x-claude-code-auxiliary-type']}"
    declared = h.get("x-claude-code-request-class")
    if declared:
        return None if declared in CLAUDE_TURN_CLASSES else f"claude-code:{declared}"
    if asked.max_tokens == 1:
        return "claude-code:probe"
    if asked.summary_request:
        return "claude-code:compaction"
    if not asked.tools:
        return "claude-code:tool-free"
    return None
