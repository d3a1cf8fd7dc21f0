#!/usr/bin/env python3
"""Claude Code's `Stop` hook for liveloop: rates the whole session it ends (POST /v1/feedback with the
session's id; the server rates that session's latest turn, so the whole trajectory: docs/api.md,
"Rating a whole agent session"). Standard library only: it runs in the user's own Python.

Claude Code runs it with the hook's JSON on stdin (`session_id`, `transcript_path`, `hook_event_name`,
...). The rating is, first found: `LIVELOOP_RATING` (up / down / 1 / 0); else, with `LIVELOOP_ASK=1`, an
answer typed on /dev/tty; else none, and the session is remembered for a later

    python3 claude_code_stop.py rate up|down [SESSION_ID]

The server: `LIVELOOP_BASE_URL`, else `ANTHROPIC_BASE_URL`; the key: `LIVELOOP_API_KEY`, else
`ANTHROPIC_API_KEY` / `ANTHROPIC_AUTH_TOKEN`. It always exits 0: a failed rating never blocks the agent."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

RATINGS = {"up": 1, "1": 1, "+": 1, "u": 1, "y": 1, "down": 0, "0": 0, "-": 0, "d": 0, "n": 0}


def state_file() -> Path:
    """Where the last session's id is kept for `rate`."""
    return Path(os.environ.get("LIVELOOP_HOOK_STATE") or Path.home() / ".liveloop" / "claude-code-session")


def server() -> tuple[str, str]:
    base = os.environ.get("LIVELOOP_BASE_URL") or os.environ.get("ANTHROPIC_BASE_URL") or "http://127.0.0.1:8000"
    key = os.environ.get("LIVELOOP_API_KEY") or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN") or ""
    base = base.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base), key


def rate(session_id: str, reward: int) -> dict:
    """POST /v1/feedback for the session; the server's answer (raises on an HTTP error)."""
    base, key = server()
    body = json.dumps({"session_id": session_id, "reward": reward}).encode()
    req = urllib.request.Request(f"{base}/v1/feedback", body, method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=float(os.environ.get("LIVELOOP_TIMEOUT", "10"))) as r:
        return json.loads(r.read())


def asked() -> int | None:
    """The rating: LIVELOOP_RATING, else (LIVELOOP_ASK=1) a thumbs typed on the terminal, else None."""
    given = os.environ.get("LIVELOOP_RATING", "").strip().lower()
    if given:
        return RATINGS.get(given)
    if os.environ.get("LIVELOOP_ASK") != "1":
        return None
    try:
        with open("/dev/tty", "r+") as tty:
            tty.write("liveloop: rate this session [u]p / [d]own / Enter to skip: ")
            tty.flush()
            return RATINGS.get(tty.readline().strip().lower())
    except OSError:
        return None


def main(argv: list[str]) -> int:
    if argv[1:2] == ["rate"]:  # rate the remembered (or named) session afterwards
        reward = RATINGS.get(argv[2].lower()) if len(argv) > 2 else None
        session = argv[3] if len(argv) > 3 else (state_file().read_text().strip() if state_file().exists() else "")
        if reward is None or not session:
            print("usage: claude_code_stop.py rate up|down [SESSION_ID]", file=sys.stderr)
            return 2
        print(json.dumps(rate(session, reward)))
        return 0
    try:
        event = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        return 0
    session = event.get("session_id")
    if not isinstance(session, str) or not session:
        return 0
    try:
        state_file().parent.mkdir(parents=True, exist_ok=True)
        state_file().write_text(session)
    except OSError:
        pass
    reward = asked()
    if reward is None:
        return 0
    try:
        rate(session, reward)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"liveloop: the session's rating was not sent: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
