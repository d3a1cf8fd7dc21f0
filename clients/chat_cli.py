"""`liveloop chat`: talk to a server in the terminal, rate each reply with a thumbs up or down. With
tools (`--tools FILE`, OpenAI function definitions), a reply that calls them shows each call, asks you
for its result (you are the tool), and the model answers with the results in its history; the rating
comes after that answer and rates the whole episode: the calls, the results you typed (observations,
never trained) and the answer are one trajectory to the learner (the server links the turns)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from liveloop.clients.client import ChatReply, LiveloopClient, LiveloopError

HELP = "type a message; after each reply answer [u]p / [d]own / Enter to skip; /reset clears history; /quit exits"
TOOL_HELP = "tools are on: when the model calls one, type the tool's result (it goes back as the tool's answer)"


def chat_loop(client: LiveloopClient, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout, max_tokens: int = 96,
              tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, seed: int | None = None) -> int:
    print(HELP, file=stdout)
    if tools:
        print(TOOL_HELP, file=stdout)
    history: list[dict[str, Any]] = []
    params: dict[str, Any] = {"max_tokens": max_tokens}
    if seed is not None:  # every reply drawn with it: a session that replays the same way
        params["seed"] = seed
    if tools:
        params["tools"] = tools
        if tool_choice is not None:
            params["tool_choice"] = tool_choice
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
        turns = 0
        while True:  # a reply, and while it calls tools, the results and the next reply
            reply = _reply(client, history, params, stdout)
            if reply is None:
                history.pop()
                break
            history.append(reply.message())
            turns += 1
            if not reply.tool_calls:  # the episode's answer: its rating rates every turn of it
                _rate(client, reply, stdin, stdout, turns)
                break
            stdout.write(f"\n[{reply.id} · version {reply.policy_version}]\n")
            if not _answer_calls(reply, history, stdin, stdout):
                return 0
            params.pop("tool_choice", None)  # a forced call once: the model answers with its results next


def _reply(client: LiveloopClient, history: list[dict[str, Any]], params: dict[str, Any], stdout: TextIO) -> ChatReply | None:
    stdout.write("bot> ")
    reply: ChatReply | None = None
    try:
        for item in client.stream_chat(history, **params):
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
        return None
    assert reply is not None
    for call in reply.tool_calls:
        stdout.write(f"\n[tool call {call['id']}] {call['function']['name']}({call['function']['arguments']})")
    return reply


def _rate(client: LiveloopClient, reply: ChatReply, stdin: TextIO, stdout: TextIO, turns: int = 1) -> None:
    what = "rate?" if turns == 1 else f"rate the episode ({turns} turns)?"
    stdout.write(f"\n[{reply.id} · version {reply.policy_version}] {what} [u/d/Enter] ")
    stdout.flush()
    rating = stdin.readline().strip().lower()
    if rating in ("u", "up", "+", "1"):
        client.feedback(reply.id, "up")
        print("thanks: thumbs up recorded", file=stdout)
    elif rating in ("d", "down", "-", "0"):
        client.feedback(reply.id, "down")
        print("thanks: thumbs down recorded", file=stdout)


def _answer_calls(reply: ChatReply, history: list[dict[str, Any]], stdin: TextIO, stdout: TextIO) -> bool:
    """Ask for each call's result and add it to the history; False when input ended."""
    for call in reply.tool_calls:
        stdout.write(f"result of {call['function']['name']} [{call['id']}]> ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            return False
        history.append({"role": "tool", "tool_call_id": call["id"], "content": line.strip()})
    return True


def load_tools(path: str) -> list[dict[str, Any]]:
    """`--tools FILE`: a JSON list of OpenAI function tools (`{"type": "function", "function": {...}}`)."""
    with open(path) as f:
        tools = json.load(f)
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in tools):
        raise ValueError(f"--tools {path}: a JSON list of {{\"type\": \"function\", \"function\": {{...}}}} objects")
    return tools
