#!/usr/bin/env python3
"""Codex's `notify` program for liveloop: rates the thread whose turn just ended (POST /v1/feedback
with the thread's id: a Codex thread is one episode, and the server rates its latest turn, so the
whole trajectory: docs/api.md, "Rating a whole agent session"). Standard library only.

Codex runs it with one JSON argument after the configured command, `{"type": "agent-turn-complete",
"thread-id", "turn-id", "cwd", "client", "input-messages", "last-assistant-message"}`, its standard
streams closed (codex-rs/hooks/src/legacy_notify.rs). The rating is `LIVELOOP_RATING` (up / down / 1 /
0) when set; otherwise the thread is remembered for a later

    python3 codex_notify.py rate up|down [THREAD_ID]

The server: `LIVELOOP_BASE_URL`, else `OPENAI_BASE_URL`; the key: `LIVELOOP_API_KEY`, else
`OPENAI_API_KEY`. It always exits 0 on a notification: a failed rating never disturbs the agent."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

RATINGS = {"up": 1, "1": 1, "+": 1, "down": 0, "0": 0, "-": 0}


def state_file() -> Path:
    """Where the last thread's id is kept for `rate`."""
    return Path(os.environ.get("LIVELOOP_HOOK_STATE") or Path.home() / ".liveloop" / "codex-thread")


def server() -> tuple[str, str]:
    base = (os.environ.get("LIVELOOP_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or "http://127.0.0.1:8000").rstrip("/")
    key = os.environ.get("LIVELOOP_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""
    return (base[:-3] if base.endswith("/v1") else base), key


def rate(thread_id: str, reward: int) -> dict:
    """POST /v1/feedback for the thread; the server's answer (raises on an HTTP error)."""
    base, key = server()
    body = json.dumps({"session_id": thread_id, "reward": reward}).encode()
    req = urllib.request.Request(f"{base}/v1/feedback", body, method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=float(os.environ.get("LIVELOOP_TIMEOUT", "10"))) as r:
        return json.loads(r.read())


def main(argv: list[str]) -> int:
    if argv[1:2] == ["rate"]:
        reward = RATINGS.get(argv[2].lower()) if len(argv) > 2 else None
        thread = argv[3] if len(argv) > 3 else (state_file().read_text().strip() if state_file().exists() else "")
        if reward is None or not thread:
            print("usage: codex_notify.py rate up|down [THREAD_ID]", file=sys.stderr)
            return 2
        print(json.dumps(rate(thread, reward)))
        return 0
    try:
        event = json.loads(argv[-1]) if len(argv) > 1 else {}
    except ValueError:
        return 0
    thread = event.get("thread-id") if isinstance(event, dict) and event.get("type") == "agent-turn-complete" else None
    if not isinstance(thread, str) or not thread:
        return 0
    try:
        state_file().parent.mkdir(parents=True, exist_ok=True)
        state_file().write_text(thread)
    except OSError:
        pass
    reward = RATINGS.get(os.environ.get("LIVELOOP_RATING", "").strip().lower())
    if reward is None:
        return 0
    try:
        rate(thread, reward)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"liveloop: the thread's rating was not sent: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
