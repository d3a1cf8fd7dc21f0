"""Agent sessions against a real server (`build_app`: hf engine on the tiny model, SQLite, under uvicorn
on 127.0.0.1): the session ids Claude Code and Codex send make their turns one episode (chat completions,
Anthropic messages, the Responses API), a resent tool call whose text re-tokenizes differently keeps the
engine's own tokens and the episode whole, side calls are stored apart, POST /v1/feedback rates a whole
session (key-scoped, 404 for an unknown one, 400 unless exactly one id), and the shipped hooks
(clients/claude_code_stop.py, clients/codex_notify.py) rate one when run as the CLIs run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import USER_KEY, USER_KEY_2

from ..conftest import served_app

MODEL = "liveloop-tiny"
ROOT = Path(__file__).resolve().parents[4]
CALC = {"type": "object", "properties": {"op": {"enum": ["add", "mul"]}, "a": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["op", "a"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Add or multiply.", "parameters": CALC}}]
CLAUDE_TOOLS = [{"name": "calc", "description": "Add or multiply.", "input_schema": CALC}]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("sessions"), model_dir) as served:
        yield served


def post(base: str, path: str, body: dict, headers: dict | None = None, key: str = USER_KEY) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, headers={"authorization": f"Bearer {key}", **(headers or {})}, timeout=120)


def chat(base: str, messages: list, headers: dict, **kw) -> dict:
    r = post(base, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 12, "seed": 3, **kw}, headers)
    assert r.status_code == 200, r.text
    return r.json()


def rate(base: str, body: dict, key: str = USER_KEY) -> httpx.Response:
    return post(base, "/v1/feedback", body, key=key)


def test_a_resent_tool_call_that_retokenizes_differently_stays_one_episode(server, model_dir):
    """The forced call is sampled under its grammar token by token; its text tokenizes to other ids. The
    resent conversation carries the sampled ids (server/edge/pipeline/splicing.py) and the session keeps
    the turns one episode: this fails if either splits the episode or re-tokenizes the history."""
    base, store = server
    from transformers import AutoTokenizer

    session = {"session-id": "codex-thread-retok", "thread-id": "codex-thread-retok"}
    first = chat(base, ASK, session, tool_choice="required", parallel_tool_calls=False, max_tokens=160, seed=1)
    call = first["choices"][0]["message"]["tool_calls"][0]
    history = ASK + [first["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
    second = chat(base, history, session)
    t1, t2 = store.feedback.get_response(first["id"]), store.feedback.get_response(second["id"])
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    sampled = list(t1.response_ids)
    assert tok.encode(tok.decode(sampled), add_special_tokens=False) != sampled  # the text re-tokenizes differently
    assert (t2.parent_id, t2.root_id, t2.turn) == (t1.id, t1.id, 1)  # one episode
    assert t2.prefix_tokens is not None and t2.prefix_tokens >= len(t1.prompt_ids) + len(sampled) - 1
    carried = list(t2.prompt_ids[len(t1.prompt_ids):t2.prefix_tokens])
    assert carried == sampled[: len(carried)] and list(t2.prompt_ids[: len(t1.prompt_ids)]) == list(t1.prompt_ids)
    assert [t.id for t in store.episodes.episode(t2.id).turns] == [t1.id, t2.id]


def test_a_claude_code_session_is_one_episode_its_side_calls_apart_and_rateable(server):
    base, store = server
    sid = "0dfa24c2-8615-42de-936c-716d7f9d5e8b-http"
    headers = {"X-Claude-Code-Session-Id": sid, "anthropic-version": "2023-06-01", "x-app": "cli"}
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": sid})}
    body = {"model": MODEL, "max_tokens": 8, "tools": CLAUDE_TOOLS, "metadata": meta}

    def messages(msgs: list, **kw) -> dict:
        r = post(base, "/v1/messages", {**body, "messages": msgs, **kw}, headers)
        assert r.status_code == 200, r.text
        return r.json()

    first = messages([{"role": "user", "content": "Say hi."}])
    title = messages([{"role": "user", "content": "Write a title for this session."}], tools=[])  # a tool-free helper
    probe = messages([{"role": "user", "content": "quota"}], max_tokens=1)
    text = "".join(b.get("text", "") for b in first["content"] if b["type"] == "text")
    second = messages([{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": text or "hi"},
                       {"role": "user", "content": "Again, differently."}])
    t2 = store.feedback.get_response(second["id"])
    assert (t2.parent_id, t2.root_id) == (first["id"], first["id"])  # not the side calls, though they are later
    for side in (title["id"], probe["id"]):
        s = store.feedback.get_response(side)
        assert (s.parent_id, s.root_id) == (None, side)
    # the session rated as a whole: its latest turn, the whole trajectory
    r = rate(base, {"session_id": sid, "reward": "up"})
    assert r.status_code == 200, r.text
    assert (r.json()["response_id"], r.json()["session_id"], r.json()["reward"]) == (second["id"], sid, 1)
    assert [f.reward for f in store.feedback.get_feedback(second["id"])] == [1]
    r = rate(base, {"session_id": sid, "reward": 0, "comment": "changed my mind"})
    assert r.json()["revisions"] == 1  # a change of mind revises the same rating
    # key-scoped: another key's request for it is a 404, as an unknown session is
    for key, name in ((USER_KEY_2, sid), (USER_KEY, "no-such-session")):
        r = rate(base, {"session_id": name, "reward": 1}, key=key)
        assert r.status_code == 404 and r.json()["error"]["param"] == "session_id", r.text


def test_feedback_names_exactly_one_target(server):
    base, _ = server
    for body in ({"reward": 1}, {"response_id": "chatcmpl-x", "session_id": "s", "reward": 1}):
        r = rate(base, body)
        assert r.status_code == 400 and "exactly one" in r.json()["error"]["message"], r.text


def test_a_codex_thread_through_the_responses_api_with_its_compaction_apart(server):
    base, store = server
    captured = json.loads((ROOT / "tests/data/agents/codex-0.169.0/turn1-request.json").read_text())["headers"]
    headers = {k: v for k, v in captured.items() if k in ("session-id", "thread-id", "x-codex-turn-metadata", "originator")}
    thread = headers["thread-id"]
    body = {"model": MODEL, "max_output_tokens": 8, "tools": [{"type": "function", "name": "calc", "parameters": CALC}]}
    turn_meta = json.loads(headers["x-codex-turn-metadata"])

    def responses(text: str, **extra_headers: str) -> str:
        r = post(base, "/v1/responses", {**body, "input": text}, {**headers, **extra_headers})
        assert r.status_code == 200, r.text
        return r.json()["id"]

    first = responses("List the files.")
    compaction = responses("Summarize the conversation.", **{"x-codex-turn-metadata": json.dumps({**turn_meta, "request_kind": "compaction"})})
    after = responses("Continue from the summary.")  # a compacted history carries no earlier tokens: the thread links it
    assert store.feedback.get_response(after).parent_id == first
    assert store.feedback.get_response(compaction).parent_id is None
    assert rate(base, {"session_id": thread, "reward": 1}).json()["response_id"] == after


def run_hook(args: list[str], base: str, tmp_path: Path, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LIVELOOP_", "ANTHROPIC_", "OPENAI_"))}
    full = {**clean, "LIVELOOP_BASE_URL": base, "LIVELOOP_API_KEY": USER_KEY, "LIVELOOP_HOOK_STATE": str(tmp_path / "state"), **env}
    return subprocess.run([sys.executable, *args], input=stdin, env=full, capture_output=True, text=True, timeout=60)


def test_the_claude_code_stop_hook_rates_the_session(server, tmp_path):
    base, store = server
    sid = "claude-hook-session"
    first = chat(base, ASK, {"X-Claude-Code-Session-Id": sid})
    event = {"session_id": sid, "transcript_path": str(tmp_path / "t.jsonl"), "cwd": str(tmp_path),
             "hook_event_name": "Stop", "stop_hook_active": False}
    hook = str(ROOT / "clients" / "claude_code_stop.py")
    done = run_hook([hook], base, tmp_path, stdin=json.dumps(event), LIVELOOP_RATING="up")
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert [f.reward for f in store.feedback.get_feedback(first["id"])] == [1]
    # without a rating it only remembers the session; `rate` rates it afterwards
    done = run_hook([hook], base, tmp_path, stdin=json.dumps(event))
    assert done.returncode == 0 and (tmp_path / "state").read_text() == sid
    done = run_hook([hook, "rate", "down"], base, tmp_path)
    assert done.returncode == 0, done.stderr
    assert [f.reward for f in store.feedback.get_feedback(first["id"])] == [0]
    # a server that refuses (an unknown session) never blocks the agent
    unknown = run_hook([hook], base, tmp_path, stdin=json.dumps({**event, "session_id": "nobody"}), LIVELOOP_RATING="up")
    assert unknown.returncode == 0 and "404" in unknown.stderr


def test_the_codex_notify_program_rates_the_thread(server, tmp_path):
    base, store = server
    thread = "019a-codex-notify-thread"
    first = chat(base, ASK, {"thread-id": thread, "session-id": thread})
    payload = {"type": "agent-turn-complete", "thread-id": thread, "turn-id": "t-1", "cwd": str(tmp_path), "client": "codex-tui",
               "input-messages": ["What is 2 + 3?"], "last-assistant-message": "5"}
    notify = str(ROOT / "clients" / "codex_notify.py")
    done = run_hook([notify, json.dumps(payload)], base, tmp_path)  # no rating set: remembered
    assert done.returncode == 0 and (tmp_path / "state").read_text() == thread
    assert store.feedback.get_feedback(first["id"]) == []
    done = run_hook([notify, "rate", "up"], base, tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["response_id"] == first["id"], done.stderr
    done = run_hook([notify, json.dumps(payload)], base, tmp_path, LIVELOOP_RATING="down")
    assert done.returncode == 0 and [f.reward for f in store.feedback.get_feedback(first["id"])] == [0]
