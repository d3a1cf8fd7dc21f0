"""The per-endpoint protocols against the session's real server (`vllm_server`: vLLM, tiny model,
SQLite; the OpenAI API tests share it): Anthropic's
POST /v1/messages driven by the official `anthropic` client unchanged (whole and streamed, system
prompt, stop sequences, feedback on the message id, errors in Anthropic's shape), and completions'
streamed logprobs, whose `text_offset`s must be the whole response's."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from .conftest import USER_KEY, USER_KEY_2, open_store

MODEL = "liveloop-tiny"
ASK = [{"role": "user", "content": "Tell me about the sea."}]
SYSTEM = "You are a friendly assistant."
GREEDY = {"temperature": 0}  # the client (2.15) has no sampling arguments: Anthropic's API still takes them in the body


@pytest.fixture(scope="module")
def server(vllm_server):
    return vllm_server


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.base_url, api_key=USER_KEY, max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def greedy(claude):
    """One greedy message with a system prompt: the reference the other tests compare with."""
    return claude.messages.create(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY)


def test_message_is_anthropics_shape_and_logged(server, greedy):
    assert greedy.type == "message" and greedy.role == "assistant" and greedy.id.startswith("msg_")
    assert [b.type for b in greedy.content] == ["text"] and greedy.content[0].text
    assert greedy.stop_reason in ("end_turn", "max_tokens") and greedy.stop_sequence is None
    extra = greedy.model_extra
    store = open_store(server)
    row = store.feedback.get_response(greedy.id)
    store.close()
    version = row.policy_version  # whatever serves now (other tests of the session may have swapped)
    assert extra["policy_version"] == version
    assert extra["version_spans"] == [{"start": 0, "end": greedy.usage.output_tokens, "version": version}]
    assert row.endpoint == "messages"
    assert len(row.prompt_ids) == greedy.usage.input_tokens
    assert len(row.response_ids) == len(row.behavior_logprobs) == greedy.usage.output_tokens
    assert (row.behavior_logprobs <= 0).all()


def test_stream_says_what_the_whole_message_says(server, claude, greedy):
    with claude.messages.stream(model=MODEL, max_tokens=24, system=[{"type": "text", "text": SYSTEM}], messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == greedy.content[0].text
    assert final.stop_reason == greedy.stop_reason and final.usage.output_tokens == greedy.usage.output_tokens
    assert final.id != greedy.id and final.model_extra["policy_version"] == greedy.model_extra["policy_version"]
    store = open_store(server)
    assert store.feedback.get_response(final.id).response_ids.tolist() == store.feedback.get_response(greedy.id).response_ids.tolist()
    store.close()
    # the raw event sequence, as Anthropic sends it (the client's iterator skips the ping)
    body = {"model": MODEL, "max_tokens": 8, "messages": ASK, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body, headers={"x-api-key": USER_KEY}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}


def test_stop_sequence_cuts_the_text_and_is_named(claude, greedy):
    full = greedy.content[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"the greedy text has no stop to pick: {full!r}"
    cut = claude.messages.create(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK, stop_sequences=[stop], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]
    with claude.messages.stream(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK, stop_sequences=[stop], extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == cut.content[0].text
        assert stream.get_final_message().stop_sequence == stop


def test_feedback_rates_the_message_id(server, greedy):
    headers = {"x-api-key": USER_KEY, "anthropic-version": "2023-06-01"}
    r = httpx.post(server.base_url + "/v1/feedback", json={"response_id": greedy.id, "reward": "up"}, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["response_id"] == greedy.id and r.json()["reward"] == 1
    other = httpx.post(server.base_url + "/v1/feedback", json={"response_id": greedy.id, "reward": 0}, headers={"x-api-key": USER_KEY_2}, timeout=60)
    assert other.status_code == 404  # another key's message: not found, as on chat
    store = open_store(server)
    assert [f.reward for f in store.feedback.get_feedback(greedy.id)] == [1]
    store.close()


def test_errors_reach_the_client_in_anthropics_shape(server, claude):
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "image" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-9", max_tokens=8, messages=ASK)
    with anthropic.Anthropic(base_url=server.base_url, api_key="sk-nope", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            wrong.messages.create(model=MODEL, max_tokens=8, messages=ASK)
    assert denied.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "incorrect API key provided"}}
    url, headers = server.base_url + "/v1/messages", {"x-api-key": USER_KEY}
    for body, fragment in (
        ({"model": MODEL, "messages": ASK}, "max_tokens"),  # required, as on Anthropic's API
        ({"model": MODEL, "max_tokens": 8, "messages": ASK, "temperature": 1.5}, "temperature"),
        ({"model": MODEL, "max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages"),
        ({"model": MODEL, "max_tokens": 0, "messages": ASK}, "max_tokens"),  # (a max_tokens past the context is clamped)
    ):
        r = httpx.post(url, json=body, headers=headers, timeout=60)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and fragment in r.json()["error"]["message"]
    # the OpenAI endpoints keep OpenAI's shape, and take x-api-key too
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, "n": 17}, headers=headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_streamed_completion_offsets_are_the_whole_ones(server):
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0, timeout=60)
    kw = dict(model=MODEL, prompt="The sea is", max_tokens=24, temperature=1.0, seed=7, logprobs=1)
    whole = oai.completions.create(**kw).choices[0]
    tokens, offsets, text = [], [], ""
    for chunk in oai.completions.create(**kw, stream=True):
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs:
            tokens += choice.logprobs.tokens
            offsets += choice.logprobs.text_offset
    assert text == whole.text and tokens == whole.logprobs.tokens
    assert len(set(offsets)) > 1 and offsets == whole.logprobs.text_offset
