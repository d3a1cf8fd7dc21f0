"""`GET /admin/learning` on a real server (`liveloop serve`, the hf engine over the tiny model, SQLite,
per-segment adapters cozy and night, the learner off): replies served to two segments and rated through
the API, then a cozy adapter version published the way its learner lane does and served; the view's
per-segment, per-version counts, reward and behaviour rates must be those of what was served (reply
texts as the chat API returned them), its moving reward that of the ratings in the order given. Bad
parameters are 400s in the OpenAI error form, an unknown segment a 404, and the route needs an admin key."""

from __future__ import annotations

import httpx
import pytest

from liveloop import devtools
from liveloop.checkpoint import checkpoint_digest
from liveloop.devtools import ADMIN_KEY, USER_KEY, random_lora_adapter, wait_until
from liveloop.rewards import make_reward
from liveloop.store import Store, StoreConfig

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {USER_KEY}"}
BEHAVIOURS = ("max_words:3", "contains:the")
SEGMENTS = 'adapters = "segment"\nnames = ["cozy", "night"]\n'
EXTRA = f"""[monitor]
enabled = false
behaviours = {list(BEHAVIOURS)!r}
""".replace("'", '"')


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    try:
        server = devtools.start_server(tmp_path_factory.mktemp("learning-view"), model_dir, "hf", segments=SEGMENTS, extra=EXTRA)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120, trust_env=False) as client:
        yield client


def _serve_and_rate(http: httpx.Client, segment: str, rewards: list[int], seed: int) -> list[tuple[int, str]]:
    """One reply per reward to `segment`, each rated with it: (the version that served it, its text)."""
    served = []
    for i, reward in enumerate(rewards):
        body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about tea."}], "max_tokens": 6,
                "seed": seed + i, "metadata": {"segment": segment}}
        r = http.post("/v1/chat/completions", headers=USER, json=body)
        assert r.status_code == 200, r.text
        reply = r.json()
        f = http.post("/v1/feedback", headers=USER, json={"response_id": reply["id"], "reward": reward})
        assert f.status_code == 200, f.text
        served.append((reply["policy_version"], reply["choices"][0]["message"]["content"]))
    return served


def _expected_rates(texts: list[str]) -> dict[str, tuple[int, int]]:
    return {b: (sum(int(make_reward(b)(t) > 0) for t in texts), len(texts)) for b in BEHAVIOURS}


def test_per_segment_per_version_figures_are_what_was_served(server, http, model_dir, tmp_path):
    cozy_base = _serve_and_rate(http, "cozy", [1, 0, 1, 1], seed=10)
    night = _serve_and_rate(http, "night", [0, 0, 1, 0], seed=20)
    assert {v for v, _ in cozy_base + night} == {0}

    store = Store(StoreConfig(url=server.store_url))
    try:
        adapter = random_lora_adapter(model_dir, tmp_path / "cozy1", seed=1)
        v1 = store.versions.publish_version(
            parent=0, checkpoint_path=str(adapter), checkpoint_sha256=checkpoint_digest(adapter), learner_step=1, samples_used=1,
            metrics={}, cursor_name="sao:cozy", last_feedback_id=0, segment="cozy",
        ).version
    finally:
        store.close()
    wait_until(lambda: _adapter(http, "cozy") == v1, 60, "the watcher to serve cozy's adapter")
    cozy_v1 = _serve_and_rate(http, "cozy", [1, 1, 0], seed=30)
    assert {v for v, _ in cozy_v1} == {v1}

    r = http.get("/admin/learning", headers=ADMIN, params={"window": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["window"], body["behaviours"]) == ("learning", 3, list(BEHAVIOURS))
    segments = {s["segment"]: s for s in body["data"]}
    assert set(segments) == {"cozy", "night", "overflow"}  # the configured segments; no response without one: no base row
    cozy = segments["cozy"]
    assert (cozy["responses"], cozy["ratings"]) == (7, 7)
    rows = {v["version"]: v for v in cozy["versions"]}
    assert list(rows) == [0, v1]
    for version, served, ups in ((0, cozy_base, 3), (v1, cozy_v1, 2)):
        row = rows[version]
        assert (row["responses"], row["reward"]["n"], row["reward"]["positive"]) == (len(served), len(served), ups)
        assert row["reward"]["low"] <= ups / len(served) <= row["reward"]["high"]
        got = {b: (x["positive"], x["n"]) for b, x in row["behaviours"].items()}
        assert got == _expected_rates([t for _, t in served])
    # ratings in the order given: 1 0 1 1 (v0) then 1 1 0 (v1); thumbs up among the last 3
    assert [(p["index"], p["version"]) for p in cozy["moving"]] == [(i + 1, 0 if i < 4 else v1) for i in range(7)]
    assert [p["reward"] for p in cozy["moving"]] == pytest.approx([1, 1 / 2, 2 / 3, 2 / 3, 1, 1, 2 / 3])

    only = http.get("/admin/learning", headers=ADMIN, params={"segment": "night"}).json()
    assert [s["segment"] for s in only["data"]] == ["night"] and only["window"] == 50
    (row,) = only["data"][0]["versions"]
    assert (row["version"], row["responses"], row["reward"]["n"], row["reward"]["positive"]) == (0, 4, 4, 1)
    assert {b: (x["positive"], x["n"]) for b, x in row["behaviours"].items()} == _expected_rates([t for _, t in night])
    assert [p["reward"] for p in only["data"][0]["moving"]] == pytest.approx([0, 0, 1 / 3, 1 / 4])

    base = http.get("/admin/learning", headers=ADMIN, params={"segment": "base"}).json()
    assert [(s["segment"], s["responses"], s["versions"]) for s in base["data"]] == [("base", 0, [])]


def _adapter(http: httpx.Client, segment: str) -> int | None:
    body = http.get("/admin/adapters", headers=ADMIN).json()
    return {s["segment"]: s["serving"] for s in body["segments"]}[segment]


@pytest.mark.parametrize("params", [{"window": 0}, {"window": "many"}, {"window": 10_001}, {"segment": ""}])
def test_bad_parameters_are_400s(http, params):
    r = http.get("/admin/learning", headers=ADMIN, params=params)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == f"query.{next(iter(params))}"


def test_unknown_segment_is_404(http):
    r = http.get("/admin/learning", headers=ADMIN, params={"segment": "nobody"})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "segment_not_found"


def test_needs_an_admin_key(http):
    assert http.get("/admin/learning").status_code == 401
    r = http.get("/admin/learning", headers=USER)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions"
