"""Property-based tests (hypothesis) over every HTTP route of one real server on the hf engine: generated
bodies (fields at and past their limits, arbitrary JSON, non-JSON bytes, NaN/Infinity, 5000-digit numbers,
deep nesting, duplicate keys), Authorization headers, content types and query strings. On every request:
1. never a 5xx but a 503 with Retry-After; every 4xx (and such a 503) is the OpenAI error body with a
   non-empty message, and a 429 carries Retry-After too;
2. a rejected request writes nothing (per key: responses, ratings, versions, events, learner switches), and
   a 200 writes exactly its own rows (one response, or none with `store: false`; one rating; one deletion);
3. another key's steady traffic alongside (USER_KEY_2, every 0.2 s) is all served and stored."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from liveloop.server.edge.auth import key_id
from liveloop.store.models import Feedback, LearnerControl, OperatorEvent, PolicyVersion, Response

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, ServerProcess, open_store, start_server, stop_server

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}  # /healthz's details are the operator's
from .strategies import (
    CHAT_BASE, CHAT_FIELDS, COMMENTS, COMPLETION_BASE, COMPLETION_FIELDS, CONTENT_TYPES, DELETE, DIGITS,
    EDGE, EDGE_INTS, JUNK, MODEL, QUERY_VALUES, RAW_BODIES, REWARDS, TEXT, encode, message_mutation,
    mutate, mutations,
)

CHAT, COMPLETIONS, FEEDBACK = "/v1/chat/completions", "/v1/completions", "/v1/feedback"
GENERATING_KEYS = (USER_KEY, ADMIN_KEY)  # the generated traffic's keys; USER_KEY_2 is the other user
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# No shrinking: every request is real, and a failure's message carries the exact request. The known
# failing inputs are pinned as explicit examples, so they are checked on every run.
SETTINGS = settings(
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example],
)


def budget(examples: int) -> settings:  # a test's number of examples over SETTINGS
    return settings(SETTINGS, max_examples=examples)


# -- the server, the store and the other user ---------------------------------------------------------
class Pacer:
    """Keeps the generated traffic under the per-key rates, so rejections are about the input."""

    LIMITS = {"chat": 550, "feedback": 1100}

    def __init__(self) -> None:
        self.sent: dict[tuple[str, str | None], deque[float]] = defaultdict(deque)

    def wait(self, kind: str, key: str | None) -> None:
        sent = self.sent[(kind, key)]
        while sent and sent[0] < time.monotonic() - 61:
            sent.popleft()
        if len(sent) >= self.LIMITS[kind]:
            time.sleep(max(0.0, sent[0] + 61 - time.monotonic()))
        sent.append(time.monotonic())


class OtherUser(threading.Thread):
    """USER_KEY_2's steady traffic while the properties run: a generation (chat, chat streamed or a
    completion, 4 tokens at most) and its rating, every `period` seconds, `max_rounds` at most."""

    def __init__(self, base_url: str, period: float = 0.2, max_rounds: int = 2000):
        super().__init__(daemon=True, name="other-user")
        self.base_url, self.period, self.max_rounds = base_url, period, max_rounds
        self.done = threading.Event()
        self.rated: list[tuple[str, int]] = []  # (response id, reward)
        self.failures: list[str] = []

    def ids(self) -> list[str]:
        return [rid for rid, _ in list(self.rated)]

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {USER_KEY_2}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=120) as client:
            for i in range(self.max_rounds):
                if self.done.is_set():
                    return
                try:
                    self._round(client, i)
                except Exception as exc:  # a dropped connection is a failure of property 3, not of the thread
                    self.failures.append(f"round {i}: {exc!r}")
                self.done.wait(self.period)

    def _round(self, client: httpx.Client, i: int) -> None:
        kind = i % 3
        if kind == 2:
            r = client.post(COMPLETIONS, json={"model": MODEL, "prompt": f"note {i}", "max_tokens": 4})
        else:
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4, "stream": kind == 1}
            r = client.post(CHAT, json=body)
        if r.status_code != 200:
            self.failures.append(f"round {i} generation: {r.status_code} {r.text[:300]}")
            return
        rid = _stream_id(r.text) if kind == 1 else r.json()["id"]
        if rid is None:
            self.failures.append(f"round {i} stream without an id or [DONE]: {r.text[-300:]}")
            return
        reward = i % 2
        f = client.post(FEEDBACK, json={"response_id": rid, "reward": reward})
        if f.status_code != 200:
            self.failures.append(f"round {i} feedback on {rid}: {f.status_code} {f.text[:300]}")
            return
        self.rated.append((rid, reward))


def _stream_id(text: str) -> str | None:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return None
    return json.loads(events[0])["id"]


@dataclass(frozen=True)
class Snapshot:
    responses: int
    feedback: int
    feedback_rewards: int
    feedback_revisions: int
    versions: int
    events: int
    switches: tuple


class Harness:
    """One server for the module, its store, the generated traffic's client and what it owns."""

    def __init__(self, server: ServerProcess, other: OtherUser):
        self.server = server
        self.other = other
        self.store = open_store(server)
        # a connection per request: after a 500 the server drops the connection, which must not fail the next request
        self.client = httpx.Client(base_url=server.base_url, timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
        self.pacer = Pacer()
        self.owner: dict[str, str] = {}  # response id -> the generating key it belongs to
        self.kept: dict[str, str] = {}  # a response per generating key that no generated request deletes
        self.backpressure: list[str] = []  # 503s with Retry-After seen (allowed, reported)
        self.last: tuple[Snapshot, str] | None = None  # the store after the last request, and that request
        self.vocab = json.loads((Path(server.model_dir) / "config.json").read_text())["vocab_size"]

    def snapshot(self) -> Snapshot:
        mine = [key_id(k) for k in GENERATING_KEYS]
        with self.store.transaction() as s:
            fb = s.execute(
                select(func.count(), func.coalesce(func.sum(Feedback.reward), 0), func.coalesce(func.sum(Feedback.revisions), 0)).where(
                    Feedback.api_key_id.in_(mine)
                )
            ).one()
            return Snapshot(
                responses=s.scalar(select(func.count()).select_from(Response).where(Response.api_key_id.in_(mine))) or 0,
                feedback=fb[0],
                feedback_rewards=fb[1],
                feedback_revisions=fb[2],
                versions=s.scalar(select(func.count()).select_from(PolicyVersion)) or 0,
                events=s.scalar(select(func.count()).select_from(OperatorEvent).where(OperatorEvent.api_key_id.in_(mine))) or 0,
                switches=tuple(s.execute(select(LearnerControl.name, LearnerControl.paused, LearnerControl.reason).order_by(LearnerControl.name)).all()),
            )

    def settle(self) -> None:
        """After a generation failed midway: wait (bounded, 10 s) until the log writer has nothing
        queued and the store has stopped changing for half a second, so that a record the server
        logs late is counted against the request that caused it."""
        last, stable_since = None, time.monotonic()
        for _ in range(100):
            health = self.client.get("/healthz", headers=ADMIN_HEADERS)
            now = self.snapshot()
            if now != last:
                last, stable_since = now, time.monotonic()
            idle = health.status_code == 200 and health.json()["writer"]["queued"] == 0
            if idle and time.monotonic() - stable_since >= 0.5:
                return
            time.sleep(0.1)

    def own(self, key: str) -> list[str]:
        return [rid for rid, k in self.owner.items() if k == key]

    def call(
        self, method: str, path: str, *, headers: list[tuple[str, Any]] | None = None, key: str | None = None,
        content: bytes | None = None, params: list[tuple[str, str]] | None = None,
    ) -> tuple[httpx.Response, Snapshot, Snapshot]:
        """Send one request; check properties 1 and 2 (rejection side); return it with the store before/after."""
        headers = list(headers or [])
        if key is not None:
            headers.append(("authorization", f"Bearer {key}"))
        if path in (CHAT, COMPLETIONS):
            self.pacer.wait("chat", presented_key(headers))
        elif path == FEEDBACK or path.startswith("/v1/responses/"):
            self.pacer.wait("feedback", presented_key(headers))
        route = _route(method, path)
        sent = f"{method} {path} params={params!r} headers={headers!r} body={_show(content)}"
        before = self.snapshot()
        if self.last is not None and before != self.last[0]:
            (was, previous), self.last = self.last, None
            raise _failure("late write")(f"the store changed after the previous request was answered: {was} -> {before}; previous: {previous}")
        try:
            r = self.client.request(method, path, headers=headers, content=content, params=params)
        except httpx.TransportError as exc:
            self.settle()
            self.last = (self.snapshot(), sent)
            raise _failure(f"connection dropped on {route}")(f"{exc!r}: {sent}{_delta(before, self.last[0])}") from None
        status = r.status_code
        if currently_in_test_context():  # the statistics (--hypothesis-show-statistics) show what the server answered
            event(f"{route} -> {status}")
        if status >= 500:
            self.settle()  # a generation that failed after it started may log its record late
        after = self.snapshot()
        what = f"{sent}\n-> {r.status_code} {dict(r.headers)!r} {r.text[:600]!r}"
        self.last = (after, what)
        if status >= 500:
            if not (status == 503 and "retry-after" in r.headers):
                raise _failure(f"{status} on {route}")(f"a {status} (only a 503 with Retry-After may be a 5xx): {what}{_delta(before, after)}")
            self.backpressure.append(what)
        if 400 <= status:
            _check_error_body(r, what, route)
            if status == 429 and "retry-after" not in r.headers:
                raise _failure(f"429 without Retry-After on {route}")(what)
            if after != before:
                raise _failure(f"rejection wrote on {route}")(f"a rejected request wrote to the store: {before} -> {after}: {what}")
        return r, before, after


_FAILURES: dict[str, type] = {}


def _failure(name: str) -> type:
    """A distinct AssertionError type per kind of failure and route: hypothesis reports each separately."""
    if name not in _FAILURES:
        _FAILURES[name] = type("PropertyFailure[" + name + "]", (AssertionError,), {})
    return _FAILURES[name]


def _delta(before: Snapshot, after: Snapshot) -> str:
    return "" if before == after else f"\nand it wrote to the store: {before} -> {after}"


def _show(content: bytes | None, edge: int = 400) -> str:
    content = content or b""
    if len(content) <= 2 * edge:
        return repr(content)
    return f"{content[:edge]!r} ...({len(content)} bytes)... {content[-edge:]!r}"


def _route(method: str, path: str) -> str:
    return f"{method} {'/v1/responses/{id}' if path.startswith('/v1/responses/') else path}"


def _check_error_body(r: httpx.Response, what: str, route: str) -> None:
    try:
        err = r.json()["error"]
        ok = set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"].strip() != ""
        ok = ok and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise _failure(f"{r.status_code} without the OpenAI error body on {route}")(f"not an OpenAI error body: {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    srv = start_server(tmp_path_factory.mktemp("properties"), model_dir, "hf")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def other_user(server):
    other = OtherUser(server.base_url)
    other.start()
    deadline = time.monotonic() + 120
    while not other.rated and not other.failures and time.monotonic() < deadline:
        time.sleep(0.1)
    yield other
    other.done.set()
    other.join(timeout=120)


@pytest.fixture(scope="module")
def h(server, other_user):
    harness = Harness(server, other_user)
    for key in GENERATING_KEYS:  # a response per generating key, kept for feedback to aim at
        r, _, _ = harness.call("POST", CHAT, key=key, content=encode({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        harness.owner[rid], harness.kept[key] = key, rid
    yield harness
    harness.client.close()
    harness.store.close()


# -- drawing from the ids seen so far, and the checks of a 200 ---------------------------------------------
def pick(data: st.DataObject, pool: list[str], label: str) -> str:
    """One of `pool` (which grows as the tests run), drawn by index so that the strategy stays the same."""
    i = data.draw(st.integers(0, 1 << 16), label=label)
    return pool[i % len(pool)] if pool else "chatcmpl-none"


def _sent_store_flag(content: bytes) -> bool:
    return json.loads(content).get("store", True) is not False


def check_generation(h: Harness, r: httpx.Response, before: Snapshot, after: Snapshot, key: str, content: bytes, what: str) -> None:
    if r.status_code != 200:
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events, what
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        errors = [c for c in chunks if "error" in c]
        assert not errors, f"a stream ended in an error event {errors}: {what}"
        assert events[-1] == "[DONE]", f"the stream did not end with [DONE]: {what}"
        rid = chunks[0]["id"]
    else:
        rid = r.json()["id"]
    assert "x-liveloop-policy-version" in r.headers, what
    stored = h.store.feedback.get_response(rid)
    if _sent_store_flag(content):
        assert stored is not None and stored.api_key_id == key_id(key), f"a 200 generation was not logged under its key: {what}"
        assert after.responses == before.responses + 1, f"a 200 generation wrote {after.responses - before.responses} rows: {what}"
        h.owner[rid] = key
    else:
        assert stored is None and after.responses == before.responses, f"store:false was logged: {what}"
    assert (after.feedback, after.versions, after.events) == (before.feedback, before.versions, before.events), what


def _what(body: bytes, r: httpx.Response) -> str:
    return f"body={_show(body)} -> {r.status_code} {r.text[:600]!r}"


TINY_TEMPERATURE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 5e-324}  # overflows logits / T


# -- 1. generation ------------------------------------------------------------------------------------------
@budget(600)
@example(base={**TINY_TEMPERATURE, "stream": False}, muts=[], msg_mut=None, key=USER_KEY)
@example(base={**TINY_TEMPERATURE, "stream": True}, muts=[], msg_mut=None, key=USER_KEY)
@given(base=CHAT_BASE, muts=mutations(CHAT_FIELDS), msg_mut=st.one_of(st.none(), message_mutation()), key=st.sampled_from(GENERATING_KEYS))
def test_chat_completions(h, base, muts, msg_mut, key):
    if msg_mut is not None:
        base = {**base, "messages": msg_mut}
    content = encode(mutate(base, muts)).encode()
    r, before, after = h.call("POST", CHAT, key=key, content=content, headers=[("content-type", "application/json")])
    check_generation(h, r, before, after, key, content, _what(content, r))


@budget(200)
@given(base=COMPLETION_BASE, muts=mutations(COMPLETION_FIELDS), edge_prompt=st.booleans(), data=st.data(), key=st.sampled_from(GENERATING_KEYS))
def test_completions(h, base, muts, edge_prompt, data, key):
    if edge_prompt:  # token ids at the vocabulary's edges, or a prompt of the wrong shape
        edge = st.one_of(
            st.lists(st.sampled_from([0, h.vocab - 1, h.vocab, h.vocab + 1, -1, 2**31 - 1, 2**31, 2**63, True, 1.0]), min_size=1, max_size=3),
            st.sampled_from([[], [""], ["a", "b"], [1, "a"], ["a", 1], [[1]], ""]),
            EDGE,
        )
        base = {**base, "prompt": data.draw(edge, label="prompt")}
    content = encode(mutate(base, muts)).encode()
    r, before, after = h.call("POST", COMPLETIONS, key=key, content=content)
    check_generation(h, r, before, after, key, content, _what(content, r))


# -- 2. feedback and deletes -----------------------------------------------------------------------------------
@budget(800)
@given(data=st.data(), key=st.sampled_from(GENERATING_KEYS), reward=REWARDS, comment=COMMENTS, muts=mutations(["response_id", "reward", "comment"]))
def test_feedback(h, data, key, reward, comment, muts):
    source = data.draw(st.sampled_from(["own", "own", "other key", "other user", "text", "junk"]), label="source")
    if source == "own":
        rid = pick(data, h.own(key), "own")
    elif source == "other key":
        rid = pick(data, h.own(GENERATING_KEYS[1 - GENERATING_KEYS.index(key)]), "other key's")
    elif source == "other user":
        rid = pick(data, h.other.ids(), "other user's")
    else:
        rid = data.draw(TEXT if source == "text" else JUNK, label="response_id")
    body = {"response_id": rid, "reward": reward} if comment is None else {"response_id": rid, "reward": reward, "comment": comment}
    content = encode(mutate(body, muts)).encode()
    r, before, after = h.call("POST", FEEDBACK, key=key, content=content)
    what = _what(content, r)
    if r.status_code == 200:
        got = r.json()
        assert h.owner.get(got["response_id"]) == key, f"a key rated a response it did not receive: {what}"
        mine = [f for f in h.store.feedback.get_feedback(got["response_id"]) if f.api_key_id == key_id(key)]
        assert [f.reward for f in mine] == [got["reward"]] and got["reward"] in (0, 1), what
        assert after.responses == before.responses and after.feedback - before.feedback in (0, 1), what


@budget(300)
@given(data=st.data(), key=st.sampled_from(GENERATING_KEYS))
def test_delete_response(h, data, key):
    source = data.draw(st.sampled_from(["own", "other user", "text", "odd"]), label="source")
    if source == "own":
        segment = quote(pick(data, [rid for rid in h.own(key) if rid != h.kept[key]], "own"), safe="")
    elif source == "other user":
        segment = quote(pick(data, h.other.ids(), "other user's"), safe="")
    elif source == "text":
        segment = quote(data.draw(st.text(st.characters(codec="utf-8"), max_size=70), label="id"), safe="")
    else:
        segment = data.draw(st.sampled_from(["x" * 64, "x" * 65, "%00", "%ff%fe", "%ED%A0%80", "..", ".", "%2F", "a%2Fb", "%20", "+", "x" * 3000]), label="id")
    path = "/v1/responses/" + segment
    r, before, after = h.call("DELETE", path, key=key)
    what = f"DELETE {path} -> {r.status_code} {r.text[:300]}"
    if r.status_code == 200:
        rid = r.json()["id"]
        assert h.owner.get(rid) == key, f"a key deleted a response it did not receive: {what}"
        assert h.store.feedback.get_response(rid) is None and after.responses == before.responses - 1, what
        assert after.feedback == before.feedback - r.json()["ratings_deleted"], what
        del h.owner[rid]


# -- 3. raw bodies, content types and Authorization on every route ----------------------------------------------
POST_ROUTES = [CHAT, COMPLETIONS, FEEDBACK, "/admin/weights", "/admin/learning/pause", "/admin/learning/resume", "/admin/rollback"]


@budget(600)
@example(path=CHAT, body=b"[" * 30_000, ctype="application/json", key=USER_KEY)  # nesting deeper than the JSON parser's recursion
@example(path="/admin/learning/pause", body=b'{"reason": ' + DIGITS.encode() + b"}", ctype="application/json", key=ADMIN_KEY)  # a 5000-digit number
@given(path=st.sampled_from(POST_ROUTES), body=RAW_BODIES, ctype=CONTENT_TYPES, key=st.sampled_from(GENERATING_KEYS))
def test_raw_bodies(h, path, body, ctype, key):
    headers = [] if ctype is None else [("content-type", ctype)]
    key = ADMIN_KEY if path.startswith("/admin") else key
    r, before, after = h.call("POST", path, key=key, content=body, headers=headers)
    if path in (CHAT, COMPLETIONS):
        check_generation(h, r, before, after, key, body, _what(body, r))


@budget(40)
@given(
    path=st.sampled_from([CHAT, COMPLETIONS]),
    encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-32", "utf-8-sig", "latin-1"]),
    ctype=CONTENT_TYPES,
)
def test_valid_body_in_other_encodings(h, path, encoding, ctype):
    body = {"model": MODEL, "max_tokens": 1, **({"messages": [{"role": "user", "content": "hé"}]} if path == CHAT else {"prompt": "hé"})}
    content = json.dumps(body, ensure_ascii=False).encode(encoding)
    r, before, after = h.call("POST", path, key=USER_KEY, content=content, headers=[] if ctype is None else [("content-type", ctype)])
    check_generation(h, r, before, after, USER_KEY, content.decode(encoding).encode(), _what(content, r))


BEARERS = st.one_of(
    st.sampled_from([USER_KEY, ADMIN_KEY, "sk-nope", "", " ", USER_KEY + " ", " " + ADMIN_KEY, USER_KEY.upper(), ADMIN_KEY[:-1], USER_KEY + "x"]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20),
)
AUTH_VALUE = st.one_of(
    BEARERS.map(lambda k: f"Bearer {k}"),
    BEARERS.map(lambda k: f"bearer {k}"),
    BEARERS.map(lambda k: f"BEARER  {k}  "),
    BEARERS.map(lambda k: f"Basic {k}"),
    BEARERS,
    st.sampled_from(["Bearer", "Bearer ", "Bearer\t" + USER_KEY, f"Bearer {USER_KEY} extra", f"Bearer {USER_KEY},Bearer {ADMIN_KEY}", "Token x", "x" * 4000]),
    st.sampled_from([b"Bearer \xff\xfe", b"Bearer " + "\u00e9".encode("latin-1"), b"Bearer sk-test-user-1\xa0"]),
)
AUTH_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(["authorization", "Authorization", "AUTHORIZATION", "x-api-key", "cookie"]),
        AUTH_VALUE.map(lambda v: v.strip(b" \t") if isinstance(v, bytes) else v.strip(" \t")),  # HTTP trims them anyway
    ),
    max_size=3,
)


def presented_key(headers: list[tuple[str, Any]]) -> str | None:
    """The key the server should take from these headers: the first Authorization header, Bearer scheme;
    without one, the first `x-api-key` header (Anthropic's clients)."""
    for name, value in headers:
        if name.lower() == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, key = text.strip(" \t").partition(" ")
            return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    for name, value in headers:
        if name.lower() == "x-api-key":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            return text.strip() or None
    return None


def _auth_routes(h: Harness) -> list[tuple[str, str, bytes | None, str | None]]:
    own = h.kept[USER_KEY]
    chat = encode({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    return [
        ("POST", CHAT, chat, "user"),
        ("POST", COMPLETIONS, encode({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(), "user"),
        ("POST", FEEDBACK, encode({"response_id": own, "reward": 1}).encode(), "user"),
        ("DELETE", "/v1/responses/chatcmpl-none", None, "user"),
        ("GET", "/v1/models", None, "user"),
        ("GET", "/v1/versions", None, "user"),
        ("GET", "/admin/versions", None, "admin"),
        ("GET", "/admin/stats", None, "admin"),
        ("GET", "/admin/events", None, "admin"),
        ("GET", "/admin/drift", None, "admin"),
        ("GET", "/admin/learner", None, "admin"),
        ("POST", "/admin/weights", encode({"path": "/nonexistent"}).encode(), "admin"),
        ("POST", "/admin/rollback", encode({"version": 99999}).encode(), "admin"),
        ("POST", "/admin/learning/pause", b"", "admin"),
        ("POST", "/admin/learning/resume", b"", "admin"),
        ("GET", "/healthz", None, None),
        ("GET", "/metrics", None, "admin"),
    ]


@budget(400)
@given(data=st.data(), headers=AUTH_HEADERS)
def test_authorization_headers(h, data, headers):
    routes = _auth_routes(h)
    method, path, body, needs = routes[data.draw(st.integers(0, len(routes) - 1), label="route")]
    headers = [(n, v) for n, v in headers if n != "cookie"] + [("cookie", f"liveloop_session={v}") for n, v in headers if n == "cookie" and isinstance(v, str)]
    r, before, after = h.call(method, path, headers=headers, content=body)
    key = presented_key(headers)
    what = f"{method} {path} headers={headers!r} -> {r.status_code} {r.text[:300]}"
    if needs is None:
        assert r.status_code == 200, what
    elif key not in (USER_KEY, ADMIN_KEY):
        assert r.status_code == 401, f"a request without a valid key was not refused with 401: {what}"
    elif needs == "admin" and key != ADMIN_KEY:
        assert r.status_code == 403, f"a user key reached an admin route: {what}"
    else:
        assert r.status_code not in (401, 403), f"a valid key was refused: {what}"
    if method == "POST" and path in (CHAT, COMPLETIONS) and key in (USER_KEY, ADMIN_KEY):
        check_generation(h, r, before, after, key, body, what)


# -- 4. admin bodies and queries, and the read-only routes ---------------------------------------------------------
ADMIN_BODIES = {
    "/admin/weights": (
        st.fixed_dictionaries({"path": st.one_of(TEXT, st.sampled_from(["/", ".", "..", "/tmp", "/proc", "a" * 300, "/" + "a/" * 1000]))}, optional={"note": TEXT}),
        ["path", "note"],
    ),
    "/admin/rollback": (
        st.fixed_dictionaries({"version": st.one_of(st.integers(0, 3), st.integers(0, 2**31 - 1), EDGE_INTS)}, optional={"reason": TEXT}),
        ["version", "reason"],
    ),
    "/admin/learning/pause": (st.fixed_dictionaries({}, optional={"reason": TEXT}), ["reason"]),
    "/admin/learning/resume": (st.fixed_dictionaries({}, optional={"reason": TEXT}), ["reason"]),
}


ADMIN_CASES = st.sampled_from(sorted(ADMIN_BODIES)).flatmap(
    lambda path: st.tuples(st.just(path), ADMIN_BODIES[path][0], mutations(ADMIN_BODIES[path][1]))
)


@budget(600)
@example(case=("/admin/weights", {"path": "a" * 300}, []))  # a path component longer than the filesystem allows
@given(case=ADMIN_CASES)
def test_admin_posts(h, case):
    path, base, muts = case
    content = encode(mutate(base, muts)).encode()
    r, before, after = h.call("POST", path, key=ADMIN_KEY, content=content)
    if r.status_code == 200:
        assert (after.responses, after.feedback) == (before.responses, before.feedback), _what(content, r)


GET_ROUTES = ["/admin/events", "/admin/drift", "/admin/versions", "/admin/stats", "/admin/learner", "/v1/models", "/v1/versions", "/healthz", "/metrics"]


@budget(600)
@given(
    path=st.sampled_from(GET_ROUTES),
    params=st.lists(st.tuples(st.one_of(st.sampled_from(["limit", "since", "since", "limit"]), st.text(max_size=6)), QUERY_VALUES), max_size=3),
    key=st.sampled_from([ADMIN_KEY, USER_KEY]),
)
def test_get_routes_with_odd_queries(h, path, params, key):
    if (path.startswith("/admin") or path == "/metrics") and key == USER_KEY:
        key = ADMIN_KEY
    r, before, after = h.call("GET", path, key=key, params=params)
    if path in ("/healthz", "/metrics"):
        assert r.status_code == 200, f"GET {path}?{params!r} -> {r.status_code} {r.text[:300]}"
    assert after == before, f"a GET wrote to the store: GET {path}?{params!r} -> {r.status_code}"


# -- 5. the other user, after everything above ----------------------------------------------------------------
def test_other_users_traffic_was_served_and_logged(h):
    other = h.other
    other.done.set()
    other.join(timeout=120)
    assert not other.is_alive()
    assert not other.failures, f"USER_KEY_2's requests failed while the generated ones ran: {other.failures[:10]}"
    assert len(other.rated) >= 3, "the other user's traffic did not run alongside"
    for rid, reward in other.rated:
        row = h.store.feedback.get_response(rid)
        assert row is not None and row.api_key_id == key_id(USER_KEY_2), f"{rid} of USER_KEY_2 is not in the store"
        assert [(f.api_key_id, f.reward) for f in h.store.feedback.get_feedback(rid)] == [(key_id(USER_KEY_2), reward)], rid
    health = h.client.get("/healthz", headers=ADMIN_HEADERS)
    assert health.status_code == 200 and health.json()["writer"]["ok"], health.text
    if h.backpressure:
        print("503s with Retry-After seen (allowed back-pressure):", *h.backpressure, sep="\n")
