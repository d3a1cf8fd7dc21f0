"""What an Anthropic Messages request holds that is not the conversation, taken out before rendering,
and the one fold a chat template may need. Pure functions over plain data; no HTTP, no tokenizer.

- Claude Code's first system block, `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;`,
  is metadata for Anthropic's billing and changes on every request: rendered, it would make two turns
  of one session differ in their first tokens (no shared prefix, no prefix cache, no linking of the
  turns). `without_billing_header` drops it (a whole block, or a string's first line).
- A `system` turn in the middle of `messages` (Claude Code's `mid-conversation-system-...` beta) is a
  system turn at that point; `fold_system_turns` is for a chat template that refuses one there
  (Gemma's, say; liveloop-tiny's and SmolLM2's take it): every system turn after the first message
  becomes user text, joined with a blank line to the plain user turn next to it (before it, else
  after it), or a user turn of its own."""

from __future__ import annotations

import re
from typing import Any

BILLING_HEADER = re.compile(r"x-anthropic-billing-header:[^\n]*")


def is_billing_header(text: str) -> bool:
    """Whether a system text block is only Claude Code's billing header line."""
    return BILLING_HEADER.fullmatch(text.strip()) is not None


def without_billing_header(system: str | list[Any] | None) -> str | list[Any] | None:
    """`system` (a string, or text blocks: anything with a `text`) without Claude Code's billing header:
    blocks that are only that line are dropped, a string loses a first line that is that line."""
    if system is None:
        return None
    if isinstance(system, str):
        first, newline, rest = system.partition("\n")
        return rest if is_billing_header(first) else system
    return [b for b in system if not is_billing_header(getattr(b, "text", ""))]


def _plain_user(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and isinstance(message.get("content"), str)


def fold_system_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` (stored shape) with every system turn but a leading one folded into user text."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # folded system text waiting for the next plain user turn
    for i, m in enumerate(messages):
        if m.get("role") == "system" and i > 0:
            text = m.get("content") or ""
            if out and _plain_user(out[-1]):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + text}
            else:
                pending.append(text)
            continue
        if pending and _plain_user(m):
            m = {**m, "content": "\n\n".join([*pending, m["content"]])}
            pending = []
        elif pending:
            out.append({"role": "user", "content": "\n\n".join(pending)})
            pending = []
        out.append(dict(m))
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def has_mid_system(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "system" for m in messages[1:])
