"""A key's daily storage budget (`[server] stored_mb_per_day`) against a real server (`build_app`: hf
engine on the tiny model, SQLite, under uvicorn on 127.0.0.1): once the store counts a key's day of
rows past it, that key's stored requests get 429 `storage_budget_exceeded` with Retry-After until the
UTC day ends, on every generating API; another key and its `store: false` requests are still served."""

from __future__ import annotations

import time

import httpx
import pytest

from liveloop.devtools import USER_KEY, USER_KEY_2, key_id
from liveloop.server.edge.admission import STORAGE_FRESH_SECONDS
from liveloop.store.keys import utc_day
from liveloop.store.models import utcnow

from ..conftest import served_app

MODEL = "liveloop-tiny"
BUDGET_MB = 0.02  # 20 kB: a few of the tiny model's replies with their conversation


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("budget"), model_dir, f"stored_mb_per_day = {BUDGET_MB}") as served:
        yield served


def _chat(base: str, key: str, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something long. " * 40}], "max_tokens": 16, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)


def test_a_key_past_its_days_budget_is_refused_until_the_day_ends(server):
    base, store = server
    attempts, refused = 0, None
    deadline = time.monotonic() + 30 * STORAGE_FRESH_SECONDS  # bounded: the count is re-read every few seconds
    while refused is None and time.monotonic() < deadline and attempts < 200:
        r = _chat(base, USER_KEY)
        attempts += 1
        if r.status_code == 429:
            refused = r
        else:
            assert r.status_code == 200, r.text
            time.sleep(0.2)
    assert refused is not None, f"no refusal in {attempts} requests"
    stored = store.keys.stored_bytes(key_id(USER_KEY), utc_day(utcnow()))
    assert stored >= BUDGET_MB * 1e6  # refused only once the store counted the budget spent
    error = refused.json()["error"]
    assert error["code"] == "storage_budget_exceeded" and "MB" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 86400
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                       ("/v1/responses", {"input": "hi", "max_output_tokens": 4}),
                       ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})):
        again = httpx.post(f"{base}{path}", json={"model": MODEL, **body}, headers={"authorization": f"Bearer {USER_KEY}"}, timeout=120)
        assert again.status_code == 429, (path, again.text)
    rows = store.feedback.counts()["responses"]
    assert _chat(base, USER_KEY, store=False).status_code == 200  # stores nothing: served
    assert _chat(base, USER_KEY_2).status_code == 200  # another key's budget is its own
    assert store.feedback.counts()["responses"] == rows + 1  # only the other key's reply was stored
