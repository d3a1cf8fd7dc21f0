"""Data rights and the edge's smaller leaks on a real server: `build_app` (hf engine on the tiny model,
SQLite, the writer) under uvicorn on 127.0.0.1, called over HTTP with the official `openai` client
and httpx.

- A response deleted while it is still being generated is never stored, nor its rating; the same for
  a key forgotten while its generation runs.
- A forgotten key gets 403 (`[auth] forgotten_keys = "refuse"`), or is served with nothing stored
  (`"unstored"`).
- /v1/versions pages (limit, after, order, has_more; bad values are 400s).
- A Host header the allow-list does not name is refused (DNS rebinding); /metrics and /healthz's
  details need the admin key; failed dashboard sign-ins are throttled (429 + Retry-After)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEY_2, USER_KEYS, free_port, serve_in_thread, write_config
from liveloop.server.edge.auth import key_id
from liveloop.store import Store, StoreConfig, VersionStatus

MSG = [{"role": "user", "content": "Tell me a long story about the sea and the night."}]
# ignore_eos: the reply runs its 480 tokens whatever it says, so it is still generating after the first
# chunk however slowly the test's own thread gets there (a reply that ended on its own could be stored first)
LONG = {"max_tokens": 480, "temperature": 1.0, "seed": 7, "extra_body": {"ignore_eos": True}}


class Running:
    def __init__(self, app, base_url: str, store_url: str, thread: threading.Thread, server: uvicorn.Server):
        self.app, self.base_url, self.store_url, self.thread, self.server = app, base_url, store_url, thread, server

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=60)

    def store(self) -> Store:
        return Store(StoreConfig(url=self.store_url))


def _serve(work: Path, model_dir: Path, auth_extra: str = "", server_extra: str = "") -> Running:
    port = free_port()
    path, store_url = write_config(work, Path(model_dir).resolve(), "hf", port, server_extra=server_extra,
                                   extra="[monitor]\nenabled = false\n")
    if auth_extra:  # a key of the [auth] table: appended to it
        path.write_text(path.read_text().replace("[engine]", f"{auth_extra}\n[engine]", 1))
    app = build_app(load_config(path), Path(model_dir))
    server, thread = serve_in_thread(app, port)
    return Running(app, f"http://127.0.0.1:{port}", store_url, thread, server)


def _stop(running: Running) -> None:
    running.server.should_exit = True
    running.thread.join(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    running = _serve(tmp_path_factory.mktemp("rights"), model_dir, server_extra="login_failures_per_minute = 3\nlogin_failures_per_minute_total = 5")
    yield running
    _stop(running)



def _first_chunk_then(server: Running, key: str, during) -> tuple[str, list]:
    """Stream a long reply with the official client; after its first chunk (the row is not stored yet:
    checked), call `during(response_id)`; then read the stream to its end."""
    stream = server.openai(key).chat.completions.create(model="liveloop-tiny", messages=MSG, stream=True, **LONG)
    chunks = iter(stream)
    first = next(chunks)
    store = server.store()
    try:
        assert store.feedback.get_response(first.id) is None  # still being generated: nothing landed yet
        assert server.app.state.edge.generating.owner(first.id) == key_id(key)
        during(first.id)
    finally:
        store.close()
    rest = list(chunks)
    return first.id, rest


def test_a_response_deleted_while_it_is_generated_is_never_stored(server):
    answers = []

    def delete(response_id: str) -> None:
        with server.client(USER_KEY) as c:
            answers.append(c.delete(f"/v1/responses/{response_id}"))

    rid, rest = _first_chunk_then(server, USER_KEY, delete)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["deleted"] is True
    assert rest[-1].choices[0].finish_reason in ("stop", "length")  # the stream ended normally
    with server.client(USER_KEY) as c:
        rating = c.post("/v1/feedback", json={"response_id": rid, "reward": 1})
        assert rating.status_code == 404, rating.text
        # another key's DELETE of an id it never received is a 404, and deletes nothing of others'
        other = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4}).json()["id"]
    with server.client(USER_KEY_2) as c2:
        assert c2.delete(f"/v1/responses/{other}").status_code == 404
    store = server.store()
    try:
        deadline = time.monotonic() + 5  # the stream's last event follows the commit: nothing can land later
        while time.monotonic() < deadline and store.feedback.get_response(rid) is None:
            time.sleep(0.2)
        assert store.feedback.get_response(rid) is None and store.feedback.get_feedback(rid) == []
        assert store.feedback.get_response(other) is not None
    finally:
        store.close()


def test_a_key_forgotten_while_its_generation_runs_stores_nothing(server):
    key = USER_KEYS[5]
    admin = server.client(ADMIN_KEY)

    def forget(_: str) -> None:
        assert admin.post(f"/admin/keys/{key_id(key)}/forget").status_code == 200

    rid, _ = _first_chunk_then(server, key, forget)
    admin.close()
    store = server.store()
    try:
        time.sleep(0.5)
        assert store.feedback.get_response(rid) is None
    finally:
        store.close()
    with server.client(key) as c:  # refused from now on (the default, "refuse")
        r = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4})
        assert r.status_code == 403 and r.json()["error"]["code"] == "key_forgotten", r.text
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 403


def test_a_forgotten_key_served_unstored(tmp_path, model_dir):
    running = _serve(tmp_path, model_dir, auth_extra='forgotten_keys = "unstored"', server_extra="ops_open_on_loopback = true")
    key = USER_KEYS[6]
    try:
        # this server opts loopback in: /metrics and the health details without a key (the client is 127.0.0.1)
        assert httpx.get(running.base_url + "/metrics").status_code == 200
        assert "writer" in httpx.get(running.base_url + "/healthz").json()
        with running.client(ADMIN_KEY) as admin:
            assert admin.post(f"/admin/keys/{key_id(key)}/forget").status_code == 200
        reply = running.openai(key).chat.completions.create(model="liveloop-tiny", messages=MSG, max_tokens=4)
        assert reply.choices[0].message.content is not None  # served
        with running.client(key) as c:
            assert c.post("/v1/feedback", json={"response_id": reply.id, "reward": 1}).status_code == 404
        store = running.store()
        try:
            assert store.feedback.get_response(reply.id) is None and store.feedback.rated_after(0, 100) == []
        finally:
            store.close()
    finally:
        _stop(running)


def test_versions_page_in_the_openai_list_form(server):
    store = server.store()
    try:
        for _ in range(4):  # failed versions: the publisher never swaps them in
            store.versions.add_version(None, parent=0, checkpoint_path="/nowhere", status=VersionStatus.FAILED)
        numbers = [v.version for v in store.versions.list_versions()]
    finally:
        store.close()
    with server.client(USER_KEY) as c:
        everything = c.get("/v1/versions").json()
        assert [v["version"] for v in everything["data"]] == numbers and everything["has_more"] is False
        first = c.get("/v1/versions", params={"limit": 1}).json()
        assert first["object"] == "list" and [v["version"] for v in first["data"]] == numbers[:1]
        assert first["first_id"] == first["last_id"] == numbers[0] and first["has_more"] == (len(numbers) > 1)
        newest = c.get("/v1/versions", params={"limit": 1, "order": "desc"}).json()
        assert [v["version"] for v in newest["data"]] == numbers[-1:]
        past = c.get("/v1/versions", params={"after": numbers[-1]}).json()
        assert past["data"] == [] and past["has_more"] is False and past["first_id"] is None
        for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after": -1}, {"order": "up"}):
            r = c.get("/v1/versions", params=bad)
            assert r.status_code == 400 and r.json()["error"]["param"].startswith("query."), (bad, r.text)


def test_a_wrong_host_header_is_refused(server):
    port = server.base_url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert httpx.get(server.base_url + "/healthz", headers={"host": host}).status_code == 200, host
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1:{int(port) + 1}", "", "127.0.0.1:x"):
        r = httpx.get(server.base_url + "/v1/models", headers={"host": host, "Authorization": f"Bearer {USER_KEY}"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", (host, r.text)


def test_metrics_and_health_details_need_the_admin_key(server):
    assert httpx.get(server.base_url + "/metrics").status_code == 401
    assert httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 403
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert "liveloop_" in httpx.get(server.base_url + "/metrics", headers=admin).text
    public = httpx.get(server.base_url + "/healthz")
    assert public.status_code == 200 and public.json() == {"status": "ok"}
    details = httpx.get(server.base_url + "/healthz", headers=admin).json()
    assert details["status"] == "ok" and "writer" in details and details["policy_version"] == 0


def test_failed_sign_ins_are_throttled_per_client_and_in_total(server):
    login = server.base_url + "/dashboard/login"
    answers = [httpx.post(login, data={"key": f"wrong-{i}"}).status_code for i in range(3)]
    assert answers == [401, 401, 401]
    r = httpx.post(login, data={"key": ADMIN_KEY})  # even the right key waits now (3 failures a minute)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    # the total (5 a minute) holds whatever address the guesses come from
    throttle = server.app.state.server.login_throttle
    throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.2")
    assert throttle.retry_after("10.0.0.3") is not None
