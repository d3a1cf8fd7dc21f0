"""The same server on the `hf` (transformers) engine, and the interactive `liveloop chat` loop driven
through scripted input against it."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import openai
import pytest

from liveloop.clients import LiveloopClient
from liveloop.clients.chat_cli import chat_loop

from .conftest import USER_KEY, Reference, open_store, start_server, stop_server


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("hf-server"), model_dir, "hf")
    yield server
    stop_server(server)


def test_openai_client_on_hf_engine(hf_server, model_dir):
    oai = openai.OpenAI(base_url=hf_server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    msgs = [{"role": "user", "content": "What do you think of rain?"}]
    resp = oai.chat.completions.create(model="liveloop-tiny", messages=msgs, max_tokens=32, seed=2, extra_body={"return_token_ids": True})
    streamed = "".join(
        c.choices[0].delta.content or "" for c in oai.chat.completions.create(model="liveloop-tiny", messages=msgs, max_tokens=32, stream=True, seed=1) if c.choices
    )
    assert resp.choices[0].message.content and streamed
    store = open_store(hf_server)
    row = store.feedback.get_response(resp.id)
    assert row.response_ids.tolist() == resp.choices[0].model_extra["token_ids"]
    expected = Reference(model_dir).logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
    assert np.abs(row.behavior_logprobs - expected).max() < 1e-3
    store.close()


def test_a_shaped_draw_logs_and_trains_its_own_distribution(hf_server, model_dir):
    oai = openai.OpenAI(base_url=hf_server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    resp = oai.chat.completions.create(model="liveloop-tiny", messages=[{"role": "user", "content": "Tell me about cats."}],
                                       max_tokens=30, temperature=2.0, top_p=0.5, seed=5, logprobs=True, top_logprobs=5)
    store = open_store(hf_server)
    try:
        Reference(model_dir).check_shaped_draw(store.feedback.get_response(resp.id))
    finally:
        store.close()
    assert all(-9999.0 <= t.logprob <= 0.0 for e in resp.choices[0].logprobs.content for t in e.top_logprobs)


def test_chat_cli_rates_replies(hf_server):
    stdin = io.StringIO("Tell me about trains.\nu\nAnd about bread?\nd\n/quit\n")
    stdout = io.StringIO()
    with LiveloopClient(hf_server.base_url, USER_KEY) as client:
        assert chat_loop(client, stdin=stdin, stdout=stdout, max_tokens=24, seed=3) == 0
    out = stdout.getvalue()
    assert out.count("bot> ") == 2 and "thumbs up recorded" in out and "thumbs down recorded" in out
    ids = [line.split("[", 1)[1].split(" ", 1)[0] for line in out.splitlines() if "· version" in line]
    store = open_store(hf_server)
    assert [store.feedback.get_feedback(i)[0].reward for i in ids] == [1, 0]
    # the second turn carried the first exchange as history
    assert len(store.feedback.get_response(ids[1]).prompt_ids) > len(store.feedback.get_response(ids[0]).prompt_ids)
    store.close()


def test_chat_cli_shows_tool_calls_and_takes_their_results(hf_server):
    calc = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "calc", "parameters": calc}}]
    # the reply calls calc (forced, once); the user types its result; the model answers with it in view,
    # and the thumbs after the answer rates the episode (both turns, linked by the server)
    stdin = io.StringIO("What is 2 + 2?\n4\nu\n/quit\n")
    stdout = io.StringIO()
    with LiveloopClient(hf_server.base_url, USER_KEY) as client:
        # seeded: the answer after the result is one reply (unseeded, a draw that imitated the call in its
        # history would call again, and the session would read the rating as that call's result)
        assert chat_loop(client, stdin=stdin, stdout=stdout, max_tokens=120, tools=tools,
                         tool_choice={"type": "function", "function": {"name": "calc"}}, seed=3) == 0
    out = stdout.getvalue()
    assert out.count("bot> ") == 2 and "[tool call call_" in out and "result of calc [call_" in out
    assert out.count("rate") == 1 and "rate the episode (2 turns)?" in out
    ids = [line.split("[", 1)[1].split(" ", 1)[0] for line in out.splitlines() if "· version" in line]
    store = open_store(hf_server)
    call_id = out.split("[tool call ", 1)[1].split("]", 1)[0]
    answer = store.conversations.get(ids[1], store.feedback.get_response(ids[1]).api_key_id, ("chat",))
    assert answer.messages[-1] == {"role": "tool", "tool_call_id": call_id, "content": "4", "name": "calc"}
    assert store.feedback.get_feedback(ids[0]) == [] and store.feedback.get_feedback(ids[1])[0].reward == 1
    assert store.feedback.get_response(ids[1]).parent_id == ids[0]  # one episode
    store.close()


def test_cli_versions_command(hf_server):
    out = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "versions", "--base-url", hf_server.base_url, "--api-key", USER_KEY],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "v0 *" in out.stdout and "serving" in out.stdout  # a user key lists versions (no reward figures)
    as_json = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "versions", "--json", "--base-url", hf_server.base_url, "--api-key", USER_KEY],
        capture_output=True, text=True, timeout=60,
    )
    assert json.loads(as_json.stdout)["data"][0]["version"] == 0


def test_a_schema_that_cannot_be_satisfied_is_a_400_for_its_request_alone(hf_server):
    """Its pattern matches nothing, so it compiles and generation reaches a dead end: that request gets
    400 grammar_dead_end (param response_format), never a 500; a chat beside it is answered."""
    import threading

    import httpx

    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[^\\s\\S]$"}}, "required": ["a"]}
    dead = {"model": "liveloop-tiny", "max_tokens": 40, "messages": [{"role": "user", "content": "fill it"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}
    headers = {"Authorization": f"Bearer {USER_KEY}"}
    beside: list[httpx.Response] = []
    other = threading.Thread(target=lambda: beside.append(httpx.post(
        hf_server.base_url + "/v1/chat/completions", headers=headers, timeout=120,
        json={"model": "liveloop-tiny", "max_tokens": 16, "seed": 4, "messages": [{"role": "user", "content": "Tell me about rain."}]})))
    other.start()
    r = httpx.post(hf_server.base_url + "/v1/chat/completions", headers=headers, json=dead, timeout=120)
    other.join(120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("grammar_dead_end", "response_format")
    assert [b.status_code for b in beside] == [200]


def test_tokenize_and_detokenize_round_trip_and_refuse_ids_outside_the_vocabulary(hf_server):
    """vLLM's tokenizer routes: a prompt's ids back to its text (decoded on the prompt thread, not the
    event loop), and an id past the vocabulary is a 400 on `tokens`."""
    import httpx

    headers = {"Authorization": f"Bearer {USER_KEY}"}
    with httpx.Client(base_url=hf_server.base_url, headers=headers, timeout=60) as c:
        ids = c.post("/tokenize", json={"model": "liveloop-tiny", "prompt": "the night sea"}).json()["tokens"]
        assert ids and c.post("/detokenize", json={"model": "liveloop-tiny", "tokens": ids}).json()["prompt"].strip() == "the night sea"
        long = c.post("/detokenize", json={"model": "liveloop-tiny", "tokens": ids * (8000 // len(ids))})  # within the body bound
        assert long.status_code == 200 and long.json()["prompt"].count("sea") == 8000 // len(ids)
        bad = c.post("/detokenize", json={"model": "liveloop-tiny", "tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
