"""The edge and the data rights on a real server (hf engine, SQLite): numbers at every type's limit are
400s naming the field before anything runs; rate limits and generation caps answer 429 with
Retry-After and never touch another key; `store: false`, DELETE /v1/responses/{id}, forgetting a key
and retention remove rows from every later training read; quarantine keeps ratings but hides them
from training; a public bind with the development keys is refused."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from liveloop.devtools import write_config
from liveloop.server.edge.auth import key_id

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, open_store, start_server, stop_server

MSG = [{"role": "user", "content": "Tell me about the sea."}]


def _client(server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _chat(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4, **body})



@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    s = start_server(tmp_path_factory.mktemp("hardening"), model_dir, "hf")
    yield s
    stop_server(s)


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", 2**63), ("seed", 2**64 + 5), ("seed", -(2**63) - 1), ("max_tokens", 2**31), ("max_tokens", 0),
        ("temperature", 2.5), ("top_p", 0), ("top_logprobs", 21), ("stop", ["x"] * 5), ("stop", "y" * 257),
        ("metadata", {f"k{i}": "v" for i in range(17)}), ("metadata", {"topic": "v" * 513}), ("user", "u" * 257),
        ("messages", [{"role": "user", "content": "hi"}] * 1025),
    ],
)
def test_numbers_at_the_limits_are_400s_before_generation(server, field, value):
    store = open_store(server)
    before = store.feedback.counts()
    with _client(server, USER_KEY) as c:
        body = {"logprobs": True} if field == "top_logprobs" else {}
        r = _chat(c, **body, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field
    assert store.feedback.counts() == before  # nothing generated, nothing written
    store.close()


@pytest.mark.parametrize("raw", [b'{"temperature": NaN}', b'{"top_p": Infinity}', b'{"temperature": -Infinity}'])
def test_non_finite_floats_are_400s(server, raw):
    body = raw[:-1] + b', "model": "liveloop-tiny", "messages": [{"role": "user", "content": "hi"}]}'
    r = httpx.post(server.base_url + "/v1/chat/completions", content=body,
                   headers={"Authorization": f"Bearer {USER_KEY}", "content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text


def test_extreme_seeds_are_served_and_stored_without_touching_other_writes(server):
    """The largest and smallest seeds the API takes are logged; other users' writes in the same
    batches are unaffected."""
    results: list[int] = []

    def other_user() -> None:
        with _client(server, USER_KEY_2) as c:
            for i in range(8):
                r = _chat(c)
                results.append(r.status_code)
                results.append(c.post("/v1/feedback", json={"response_id": r.json()["id"], "reward": 1}).status_code)

    t = threading.Thread(target=other_user)
    t.start()
    with _client(server, USER_KEY) as c:
        ids = {seed: _chat(c, seed=seed).json()["id"] for seed in (2**63 - 1, -(2**63), 0)}
    t.join(120)
    assert results and set(results) == {200}
    store = open_store(server)
    assert {seed: store.feedback.get_response(rid).seed for seed, rid in ids.items()} == {s: s for s in ids}
    store.close()


def test_store_false_serves_and_logs_nothing(server):
    store = open_store(server)
    before = store.feedback.counts()
    with _client(server, USER_KEY) as c:
        r = _chat(c, store=False)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        rid = r.json()["id"]
        streamed = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4,
                                                        "stream": True, "store": False})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        fb = c.post("/v1/feedback", json={"response_id": rid, "reward": 1})
    assert fb.status_code == 404  # nothing to rate: it was never stored
    assert store.feedback.get_response(rid) is None and store.feedback.counts() == before
    store.close()


def test_delete_response_removes_it_from_training(server):
    store = open_store(server)
    with _client(server, USER_KEY) as c, _client(server, USER_KEY_2) as other:
        rid = _chat(c).json()["id"]
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200
        assert any(r.id == rid for _, r in store.feedback.rated_after(0, 100_000))
        assert other.delete(f"/v1/responses/{rid}").status_code == 404  # not theirs: no leak, no delete
        gone = c.delete(f"/v1/responses/{rid}")
        assert gone.status_code == 200 and gone.json()["ratings_deleted"] == 1
        assert c.delete(f"/v1/responses/{rid}").status_code == 404
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": 0}).status_code == 404
    assert store.feedback.get_response(rid) is None and store.feedback.get_feedback(rid) == []
    assert all(r.id != rid for _, r in store.feedback.rated_after(0, 100_000))  # no training or replay reads it
    store.close()


def _tombstones(store) -> int:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM deleted_responses")).scalar()


def test_a_key_cannot_write_tombstones_for_ids_that_are_not_its_own(server):
    """Deleting names an id; only one that could be this key's response still on its way leaves a mark."""
    store = open_store(server)
    with _client(server, USER_KEY) as c, _client(server, USER_KEY_2) as other:
        theirs = _chat(c).json()["id"]
        before = _tombstones(store)
        for rid in [theirs, "r-1", "x" * 64, "chatcmpl-" + "z" * 32]:  # another key's stored reply, ids never issued
            assert other.delete(f"/v1/responses/{rid}").status_code == 404
        assert _tombstones(store) == before and store.feedback.get_response(theirs) is not None
        assert other.delete(f"/v1/responses/chatcmpl-{'a' * 32}").status_code == 404  # could be theirs, generating elsewhere
        assert _tombstones(store) == before + 1
    store.close()


def test_the_api_description_is_for_operators_only(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as anon, _client(server, USER_KEY) as user, _client(server, ADMIN_KEY) as admin:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert anon.get(path).status_code in (401, 404), path
            assert user.get(path).status_code in (401, 403, 404), path
        assert "/v1/chat/completions" in admin.get("/openapi.json").json()["paths"]
        page = admin.get("/docs")
    assert page.status_code == 200
    # every asset the page loads from elsewhere is pinned to a version and carries its hash: a changed
    # file on the CDN is refused by the browser instead of running in an admin's session
    tags = re.findall(r"<(?:script|link)\b[^>]*>", page.text)
    external = [t for t in tags if re.search(r'(?:src|href)="(?!data:)[a-z]+://', t)]
    assert len(external) == 2, tags
    for tag in external:
        assert re.search(r'integrity="sha384-[A-Za-z0-9+/]{64}"', tag) and 'crossorigin="anonymous"' in tag, tag
        assert re.search(r"swagger-ui-dist@\d+\.\d+\.\d+/", tag), tag


def test_replies_name_their_replica_without_the_host_or_pid(server):
    import socket

    with _client(server, USER_KEY) as c, _client(server, ADMIN_KEY) as admin:
        name = _chat(c).headers["x-liveloop-replica"]
        row = next(r for r in admin.get("/admin/replicas").json()["data"] if r["id"] == name)  # operators map it
    assert socket.gethostname() not in name and str(row["pid"]) not in name and row["pid"] > 0


def test_forget_a_key(server):
    store = open_store(server)
    with _client(server, USER_KEY_2) as c:
        ids = [_chat(c).json()["id"] for _ in range(3)]
        for rid in ids:
            assert c.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200
    with _client(server, ADMIN_KEY) as admin:
        assert admin.post("/admin/keys/not-a-key/forget").status_code == 400
        done = admin.post(f"/admin/keys/{key_id(USER_KEY_2)}/forget")
        assert done.status_code == 200 and done.json()["responses_deleted"] >= 3 and done.json()["ratings_deleted"] >= 3
        events = admin.get("/admin/events").json()["data"]
    assert any(e["kind"] == "forget" and e["detail"]["key_id"] == key_id(USER_KEY_2) for e in events)
    assert all(store.feedback.get_response(rid) is None for rid in ids)
    assert all(f.api_key_id != key_id(USER_KEY_2) for f, _ in store.feedback.rated_after(0, 100_000))
    store.close()


def test_quarantine_hides_ratings_from_training_and_lifts(server):
    store = open_store(server)
    key = key_id(USER_KEY)
    with _client(server, USER_KEY) as c:
        rid = _chat(c).json()["id"]
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200
    with _client(server, ADMIN_KEY) as admin:
        q = admin.post(f"/admin/keys/{key}/quarantine", json={"reason": "test"})
        assert q.status_code == 200 and q.json()["changed"]
        assert store.feedback.get_feedback(rid), "quarantined ratings are kept"
        assert all(r.id != rid for _, r in store.feedback.rated_after(0, 100_000)), "but never trained or replayed"
        listed = {k["key_id"]: k for k in admin.get("/admin/keys").json()["data"]}
        assert listed[key]["quarantined"] and listed[key]["reason"] == "test"
        assert admin.delete(f"/admin/keys/{key}/quarantine").json()["changed"]
    assert any(r.id == rid for _, r in store.feedback.rated_after(0, 100_000))
    store.close()


def test_rate_limits_and_generation_caps(tmp_path, model_dir):
    server = start_server(
        tmp_path / "limits", model_dir, "hf",
        server_extra="chat_requests_per_minute = 5\nfeedback_per_minute = 3\nstored_reads_per_minute = 4\nmax_concurrent_per_key = 1",
        rate_limits=True,
    )
    try:
        with _client(server, USER_KEY) as c, _client(server, USER_KEY_2) as other:
            codes = [_chat(c).status_code for _ in range(6)]
            assert codes[:5] == [200] * 5 and codes[5] == 429
            limited = _chat(c)
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
            assert limited.json()["error"]["type"] == "rate_limit_error"
            assert _chat(other).status_code == 200  # another key is not affected
            rid = _chat(other).json()["id"]
            fb = [other.post("/v1/feedback", json={"response_id": rid, "reward": i % 2}).status_code for i in range(4)]
            assert fb == [200, 200, 200, 429]
            # reads of stored responses have a rate of their own, over every route that reads them
            reads = [other.get(f"/v1/chat/completions/{rid}"), other.get("/v1/chat/completions"),
                     other.get(f"/v1/chat/completions/{rid}/messages"), other.get(f"/v1/chat/completions/{rid}"),
                     other.get("/v1/chat/completions")]
            assert [r.status_code for r in reads] == [200, 200, 200, 200, 429], [r.text for r in reads]
            assert int(reads[-1].headers["retry-after"]) >= 1 and reads[-1].json()["error"]["type"] == "rate_limit_error"
            assert c.get("/v1/chat/completions").status_code == 200  # another key's reads are its own
        # one generation at a time per key: a second concurrent one is refused, not queued
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY_2}"}, timeout=60) as c2:
            body = {"model": "liveloop-tiny", "messages": MSG, "max_tokens": 200, "stream": True}
            with c2.stream("POST", "/v1/chat/completions", json=body) as first:
                assert first.status_code == 200
                second = _chat(c2)
                assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_concurrent_requests"
    finally:
        stop_server(server)


def test_retention_deletes_old_rows(tmp_path, model_dir):
    server = start_server(tmp_path / "retention", model_dir, "hf", store_extra="retain_days = 0.00003\nretention_interval_seconds = 0.5")
    try:
        with _client(server, USER_KEY) as c:
            rid = _chat(c).json()["id"]
            c.post("/v1/feedback", json={"response_id": rid, "reward": 1})
        store = open_store(server)
        deadline = time.monotonic() + 60
        while store.feedback.get_response(rid) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert store.feedback.get_response(rid) is None and store.feedback.get_feedback(rid) == []
        store.close()
    finally:
        stop_server(server)


def test_public_bind_with_dev_keys_is_refused(tmp_path, model_dir):
    config, _ = write_config(tmp_path, model_dir, "hf", 8123)
    out = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), "serve", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "dev_user_keys" in out.stderr and "listens beyond loopback" in out.stderr


def test_pin_versions(server):
    with _client(server, ADMIN_KEY) as admin:
        assert admin.post("/admin/versions/0/pin").json() == {"object": "policy_version", "version": 0, "pinned": True, "changed": True}
        assert admin.post("/admin/versions/0/pin").json()["changed"] is False
        assert admin.post("/admin/versions/999/pin").status_code == 404
        assert admin.post("/admin/versions/-1/pin").status_code == 400
        assert admin.post("/admin/versions/0/unpin").json()["changed"] is True
    with _client(server, USER_KEY) as user:
        assert user.post("/admin/versions/0/pin").status_code == 403


def test_text_the_store_keeps_cannot_hold_nul(server):
    """PostgreSQL text cannot hold NUL: stored strings refuse it at the edge, on either store."""
    with _client(server, USER_KEY) as c:
        r = _chat(c, metadata={"topic": "a\x00b"})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("metadata")
        rid = _chat(c).json()["id"]
        fb = c.post("/v1/feedback", json={"response_id": rid, "reward": 1, "comment": "x\x00"})
        assert fb.status_code == 400 and fb.json()["error"]["param"] == "comment"
        assert c.post("/v1/feedback", json={"response_id": "a\x00", "reward": 1}).status_code == 400


def test_a_full_log_queue_is_a_503_with_retry_after(tmp_path, model_dir):
    """A burst larger than the writer's queue: the overflow is refused at once (503 + Retry-After, the
    event loop never blocks), everything acknowledged is stored, and the server serves on."""
    import asyncio

    server = start_server(tmp_path / "queue", model_dir, "hf", store_extra="queue_max = 1\nbatch_max = 1")
    try:
        with _client(server, USER_KEY) as c:
            rid = _chat(c).json()["id"]

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"},
                                         timeout=60, limits=httpx.Limits(max_connections=300)) as ac:
                return await asyncio.gather(*[ac.post("/v1/feedback", json={"response_id": rid, "reward": i % 2})
                                              for i in range(300)])

        answers = asyncio.run(burst())
        codes = {r.status_code for r in answers}
        assert codes <= {200, 503} and 503 in codes and 200 in codes, codes
        refused = [r for r in answers if r.status_code == 503]
        assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "log_queue_full" for r in refused)
        store = open_store(server)
        (row,) = store.feedback.get_feedback(rid)
        assert row.revisions + 1 == sum(r.status_code == 200 for r in answers)  # every acknowledged rating landed
        store.close()
        with _client(server, USER_KEY) as c:
            assert _chat(c).status_code == 200 and httpx.get(server.base_url + "/healthz").status_code == 200
    finally:
        stop_server(server)
