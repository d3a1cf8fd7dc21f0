"""Which client session a request belongs to, and whether it is a side call (server/edge/sessions.py),
read from the requests Codex 0.169.0 and Claude Code 2.1.328 really sent (tests/data/agents/) and from
hand-made variants of them: the markers each CLI sets on its side calls."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from liveloop.server.edge.sessions import Asked, ClientSession, read_session
from liveloop.store.linking import episode_tag, session_tag

AGENTS = Path(__file__).resolve().parents[4] / "tests" / "data" / "agents"
CODEX_ID = "01a24f18-61f3-7c42-918d-9705028ab6c7"
CLAUDE_ID = "0dfa24c2-8615-42de-936c-716d7f9d5e8b"


def captured(name: str) -> tuple[dict, dict]:
    data = json.loads((AGENTS / name).read_text())
    return dict(data["headers"]), copy.deepcopy(data["body"])


def read(headers: dict, body: dict) -> ClientSession | None:
    return read_session(headers, Asked.of_body(body))


def test_a_codex_turn_is_its_threads_episode():
    headers, body = captured("codex-0.169.0/turn1-request.json")
    got = read(headers, body)
    assert got == ClientSession(CODEX_ID, "codex", None)
    assert got.tag == session_tag(CODEX_ID) == episode_tag({"episode_id": CODEX_ID})  # rateable by either name


def test_codex_is_read_from_its_headers_alone_and_from_its_body_alone():
    headers, body = captured("codex-0.169.0/turn1-request.json")
    assert read(headers, {k: v for k, v in body.items() if k != "client_metadata"}).id == CODEX_ID
    assert read({"content-type": "application/json"}, body).id == CODEX_ID
    assert read({"session-id": "s-only"}, {}).id == "s-only"


def test_a_codex_sub_agents_thread_is_an_episode_of_its_own():
    headers, body = captured("codex-0.169.0/turn1-request.json")
    body["client_metadata"]["thread_id"] = "child-thread"  # the session stays the root's
    headers["thread-id"] = "child-thread"
    assert read(headers, body).id == "child-thread"
    assert read({"session-id": "root", "thread-id": "child"}, {}).id == "child"  # a thread beats its session


def test_a_codex_compaction_is_a_side_call():
    headers, body = captured("codex-0.169.0/turn1-request.json")
    turn = json.loads(headers["x-codex-turn-metadata"])
    headers["x-codex-turn-metadata"] = json.dumps({**turn, "request_kind": "compaction"})
    got = read(headers, body)
    assert (got.id, got.side, got.tag) == (CODEX_ID, "codex:compaction", None)
    del headers["x-codex-turn-metadata"]  # only the body's copy of the turn metadata says it
    body["client_metadata"]["x-codex-turn-metadata"] = json.dumps({**turn, "request_kind": "compaction"})
    assert read(headers, body).side == "codex:compaction"


@pytest.mark.parametrize("name", ["claude-code-2.1.328/main-request.json", "claude-code-2.1.328/main-request-all-tools.json"])
def test_a_claude_code_main_request_is_its_sessions_episode(name):
    headers, body = captured(name)
    assert read(headers, body) == ClientSession(CLAUDE_ID, "claude-code", None)


def test_claude_code_without_the_header_is_read_from_metadata_user_id():
    headers, body = captured("claude-code-2.1.328/main-request.json")
    del headers["X-Claude-Code-Session-Id"]
    assert read(headers, body).id == CLAUDE_ID
    body["metadata"]["user_id"] = "not json"  # an ordinary user id names no session
    assert read(headers, body) is None


def test_a_claude_code_sub_agent_is_an_episode_of_its_own():
    headers, body = captured("claude-code-2.1.328/main-request.json")
    headers["x-claude-code-agent-id"] = "a1b2"
    assert read(headers, body) == ClientSession(f"{CLAUDE_ID}/agent:a1b2", "claude-code", None)


@pytest.mark.parametrize(("change", "side"), [
    ({"max_tokens": 1}, "claude-code:probe"),  # quota_check / model_validation: max_tokens 1
    ({"tools": []}, "claude-code:tool-free"),  # its tool-free helpers: session title, summaries
])
def test_claude_code_side_calls_by_their_body(change, side):
    headers, body = captured("claude-code-2.1.328/main-request.json")
    body.update(change)
    got = read(headers, body)
    assert (got.id, got.side, got.tag) == (CLAUDE_ID, side, None)


@pytest.mark.parametrize(("header", "value", "side"), [
    ("x-claude-code-request-class", "auxiliary", "claude-code:auxiliary"),
    ("x-claude-code-request-class", "compaction", "claude-code:compaction"),
    ("x-claude-code-request-class", "side_reply", "claude-code:side_reply"),
    ("x-claude-code-request-class", "main", None),
    ("x-claude-code-request-class", "subagent", None),
    ("x-claude-code-auxiliary-type", "memory_save", "claude-code:memory_save"),
])
def test_claude_code_side_calls_by_their_headers(header, value, side):
    headers, body = captured("claude-code-2.1.328/main-request.json")
    headers[header] = value
    assert read(headers, body).side == side


def test_a_declared_main_request_is_a_turn_even_without_tools():
    headers, body = captured("claude-code-2.1.328/main-request.json")
    headers["x-claude-code-request-class"], body["tools"] = "main", []
    assert read(headers, body).side is None


def test_metadata_episode_id_wins():
    headers, body = captured("claude-code-2.1.328/main-request.json")
    body["metadata"]["episode_id"] = "job-7"
    assert read(headers, body) == ClientSession("job-7", "metadata", None)
    assert read({}, {"metadata": {"episode_id": "job-7"}, "tools": []}).side is None  # no CLI rules for it


def test_no_session_and_ids_that_are_none():
    assert read({}, {"metadata": {"user_id": "u1"}}) is None
    assert read({"session-id": ""}, {}) is None
    assert read({"session-id": "x" * 513}, {}) is None  # longer than any client's id: not a session
    assert read({}, {"metadata": {"episode_id": 7}}) is None


def test_asked_of_a_parsed_request_reads_its_fields():
    class Meta:
        def model_dump(self, exclude_none: bool = False) -> dict:
            return {"user_id": json.dumps({"session_id": "s9"})}

    class Req:  # an Anthropic request model: metadata is a model, max_tokens, tools
        metadata, max_tokens, tools = Meta(), 1, [object()]

    asked = Asked.of_request(Req())
    assert (asked.max_tokens, asked.tools) == (1, 1)
    assert read_session({}, asked) == ClientSession("s9", "claude-code", "claude-code:probe")


@pytest.mark.parametrize("prompt", [
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the user's explicit requests",
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed summary of this conversation.",
])
def test_a_claude_code_compaction_without_its_headers_is_a_side_call(prompt):
    """Claude Code compacts with the session's own tools offered (its cache prefix) and max_tokens as a
    turn's: only the summary request, its last user message, tells it from a turn."""
    headers, body = captured("claude-code-2.1.328/main-request.json")
    assert body["tools"] and read(headers, body).side is None
    body["messages"].append({"role": "user", "content": [{"type": "text", "text": prompt}]})
    got = read(headers, body)
    assert (got.id, got.side, got.tag) == (CLAUDE_ID, "claude-code:compaction", None)
    body["messages"][-1]["content"] = prompt  # a plain string content too
    assert read(headers, body).side == "claude-code:compaction"
    body["messages"].append({"role": "assistant", "content": "<summary>...</summary>"})
    assert read(headers, body).side is None  # the summary request is not the last message: a turn


def test_a_parsed_messages_request_carries_the_summary_request():
    from liveloop.server.edge.messages.protocol import MessagesRequest

    headers, body = captured("claude-code-2.1.328/main-request.json")
    body["messages"].append({"role": "user", "content": [{"type": "text", "text": "Your task is to create a detailed summary of the recent messages"}]})
    asked = Asked.of_request(MessagesRequest.model_validate(body))
    assert asked.summary_request and read_session(headers, asked).side == "claude-code:compaction"
