"""`liveloop chat`: talk to a server in the terminal, rate each reply with a thumbs up or down."""

from __future__ import annotations

import sys
from typing import TextIO

from liveloop.clients.client import ChatReply, LiveloopClient, LiveloopError

HELP = "type a message; after each reply answer [u]p / [d]own / Enter to skip; /reset clears history; /quit exits"


def chat_loop(client: LiveloopClient, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout, max_tokens: int = 96) -> int:
    print(HELP, file=stdout)
    history: list[dict[str, str]] = []
    while True:
        stdout.write("you> ")
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() in ("/quit", "/exit"):
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            history.clear()
            continue
        history.append({"role": "user", "content": text})
        stdout.write("bot> ")
        reply: ChatReply | None = None
        try:
            for item in client.stream_chat(history, max_tokens=max_tokens):
                if isinstance(item, str):
                    stdout.write(item)
                    stdout.flush()
                else:
                    reply = item
        except LiveloopError as exc:
            if exc.status in (401, 403):  # a wrong key fails every turn: end with the one line it deserves
                stdout.write("\n")
                raise
            print(f"\n[error] {exc}", file=stdout)
            history.pop()
            continue
        assert reply is not None
        history.append({"role": "assistant", "content": reply.text})
        stdout.write(f"\n[{reply.id} · version {reply.policy_version}] rate? [u/d/Enter] ")
        stdout.flush()
        rating = stdin.readline().strip().lower()
        if rating in ("u", "up", "+", "1"):
            client.feedback(reply.id, "up")
            print("thanks: thumbs up recorded", file=stdout)
        elif rating in ("d", "down", "-", "0"):
            client.feedback(reply.id, "down")
            print("thanks: thumbs down recorded", file=stdout)
