"""Per-segment adapters as operators run them, on one real server (`liveloop serve`, the `hf` engine,
SQLite, `[segments] adapters = "segment"` with segments cozy and night, the learner off): adapter
versions are real peft LoRA directories published into the store the way a segment's learner lane
publishes them (`publish_version(..., segment=)`, status published), and the server's version watcher
activates them.

Checked through the admin API and the CLI: a request is routed by `metadata.segment` (cozy is answered
by cozy's serving adapter and recorded as cozy's; night without an adapter yet, and unknown or missing
segments, by the base), a segment's pause holds back only its own activations, a segment's rollback
(to an older adapter, then to the base) moves only that segment, `GET /admin/adapters` and
`GET /admin/versions?segment=` show each lineage, `liveloop adapters / versions --segment /
learning pause --segment` print and move them, and the dashboard's adapters panel (a real headless
Chromium) pauses a segment and serves one the base again from its row.

The tests share the server and run in file order; each reads the versions it needs from the API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from liveloop.checkpoint import checkpoint_digest
from liveloop.devtools import random_lora_adapter, wait_until

from .conftest import ADMIN_KEY, USER_KEY, open_store, start_server, stop_server
from .test_operator import browser  # noqa: F401 (the headless Chromium fixture, shared)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {USER_KEY}"}
SEGMENTS = 'adapters = "segment"\nnames = ["cozy", "night"]\n'  # [segments]
EXTRA = """[monitor]
enabled = false
"""
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _save_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    return random_lora_adapter(model_dir, out, seed, rank=4, targets=tuple(TARGETS))


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("segment-adapters")
    return {name: _save_adapter(model_dir, root / name, seed) for name, seed in (("cozy1", 1), ("cozy2", 2), ("night1", 3))}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("segments-server"), model_dir, "hf", segments=SEGMENTS, extra=EXTRA)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def store(server):
    store = open_store(server)
    yield store
    store.close()


def _publish(store, directory: Path, segment: str, parent: int) -> int:
    """What a segment's learner lane writes: the adapter version and its lane's cursor, in one transaction."""
    return store.versions.publish_version(  # the number is allocated in the inserting transaction
        parent=parent, checkpoint_path=str(directory), checkpoint_sha256=checkpoint_digest(directory),
        learner_step=1, samples_used=1, metrics={}, cursor_name=f"sao:{segment}", last_feedback_id=0, segment=segment,
    ).version


def _chat(http: httpx.Client, segment: str | None, seed: int = 11) -> dict:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about tea."}], "max_tokens": 6, "seed": seed}
    if segment is not None:
        body["metadata"] = {"segment": segment}
    r = http.post("/v1/chat/completions", headers=USER, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _adapters(http: httpx.Client) -> dict[str, dict]:
    body = http.get("/admin/adapters", headers=ADMIN).json()
    assert body["adapters"] == "segment"
    return {s["segment"]: s for s in body["segments"]}


def _serving(http: httpx.Client) -> dict[str, int | None]:
    return {name: s["serving"] for name, s in _adapters(http).items()}


def _statuses(http: httpx.Client) -> dict[int, str]:
    return {v["version"]: v["status"] for v in http.get("/admin/versions", headers=ADMIN).json()["data"]}


def _wait_activated(http: httpx.Client, segment: str, version: int, what: str) -> None:
    """Until `version` serves `segment` in the engine and the store's activation has committed: the
    engine swaps an adapter in first and the store records it right after (server/control/activator.py), so the
    engine's view alone can run a moment ahead of the statuses."""
    wait_until(lambda: _serving(http)[segment] == version and _statuses(http)[version] == "serving", 30, what)


def _recorded(store, reply: dict) -> tuple[str | None, int]:
    row = wait_until(lambda: store.feedback.get_response(reply["id"]), 10, "the response to be logged")
    return row.segment, row.policy_version


def test_segments_start_on_the_base(http):
    body = http.get("/admin/adapters", headers=ADMIN).json()
    assert body["adapters"] == "segment" and body["base_version"] == 0
    assert [s["segment"] for s in body["segments"]] == ["cozy", "night", "overflow"]
    for s in body["segments"]:
        assert (s["serving"], s["policy_version"], s["paused"], s["versions"], s["latest"]) == (None, 0, False, 0, None)
        assert s["learner"] == f"sao:{s['segment']}"


def test_requests_are_routed_by_their_segment(http, store, adapter_dirs):
    cozy1 = _publish(store, adapter_dirs["cozy1"], "cozy", parent=0)
    _wait_activated(http, "cozy", cozy1, "the watcher to activate cozy's adapter")
    assert _serving(http) == {"cozy": cozy1, "night": None, "overflow": None}

    cozy, night, other, untagged = _chat(http, "cozy"), _chat(http, "night"), _chat(http, "somebody-else"), _chat(http, None)
    assert (cozy["policy_version"], night["policy_version"], other["policy_version"], untagged["policy_version"]) == (cozy1, 0, 0, 0)
    assert _recorded(store, cozy) == ("cozy", cozy1)
    assert _recorded(store, night) == ("night", 0)
    assert _recorded(store, other) == ("overflow", 0) and _recorded(store, untagged) == ("overflow", 0)
    # the same prompt and seed, through the adapter and without it: not the same distribution
    a, b = store.feedback.get_response(cozy["id"]), store.feedback.get_response(night["id"])
    assert (a.response_ids.tobytes(), a.behavior_logprobs.tobytes()) != (b.response_ids.tobytes(), b.behavior_logprobs.tobytes())

    # a rating counts for the version that served the response: cozy's adapter, not the base
    r = http.post("/v1/feedback", headers=USER, json={"response_id": cozy["id"], "reward": 1})
    assert r.status_code == 200, r.text
    latest = _adapters(http)["cozy"]["latest"]
    assert (latest["version"], latest["status"], latest["responses"], latest["reward"]["n"], latest["reward"]["positive"]) == (
        cozy1, "serving", 1, 1, 1
    )
    rows = {v["version"]: v for v in http.get("/admin/versions", headers=ADMIN).json()["data"]}
    assert rows[cozy1]["segment"] == "cozy" and rows[cozy1]["serving"] and rows[cozy1]["parent"] == 0
    assert rows[0]["segment"] is None and rows[0]["serving"] and rows[0]["reward"]["n"] == 0


def test_a_segments_pause_holds_back_only_its_own_activation(http, store, adapter_dirs):
    cozy1 = _serving(http)["cozy"]
    r = http.post("/admin/learning/pause", headers=ADMIN, json={"segment": "cozy", "reason": "look at cozy"})
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "learning", "learner": "sao:cozy", "paused": True, "changed": True, "segment": "cozy"}
    assert not http.get("/admin/stats", headers=ADMIN).json()["learning_paused"]  # the base learner's switch is not it

    cozy2 = _publish(store, adapter_dirs["cozy2"], "cozy", parent=cozy1)
    night1 = _publish(store, adapter_dirs["night1"], "night", parent=0)
    _wait_activated(http, "night", night1, "the watcher to activate night's adapter")
    time.sleep(1.0)  # ten watcher passes: an unpaused cozy would have moved by now
    assert _serving(http) == {"cozy": cozy1, "night": night1, "overflow": None}
    assert _statuses(http)[cozy2] == "published"
    state = _adapters(http)
    assert (state["cozy"]["paused"], state["night"]["paused"], state["cozy"]["versions"], state["night"]["versions"]) == (True, False, 2, 1)
    assert state["cozy"]["latest"]["version"] == cozy2 and state["cozy"]["policy_version"] == cozy1
    assert _chat(http, "cozy")["policy_version"] == cozy1 and _chat(http, "night")["policy_version"] == night1

    r = http.post("/admin/learning/resume", headers=ADMIN, json={"segment": "cozy"})
    assert r.json() == {"object": "learning", "learner": "sao:cozy", "paused": False, "changed": True, "segment": "cozy"}
    _wait_activated(http, "cozy", cozy2, "the watcher to activate cozy's newer adapter after resume")
    statuses = _statuses(http)
    assert (statuses[cozy1], statuses[cozy2], statuses[night1], statuses[0]) == ("retired", "serving", "serving", "serving")
    assert _chat(http, "cozy")["policy_version"] == cozy2

    r = http.post("/admin/learning/pause", headers=ADMIN, json={"segment": "evening"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "segment_not_found", r.text


def test_versions_list_one_lineage(http):
    serving = _serving(http)
    cozy = http.get("/admin/versions", headers=ADMIN, params={"segment": "cozy"}).json()
    assert {v["segment"] for v in cozy["data"]} == {"cozy"} and len(cozy["data"]) == 2
    assert (cozy["segment"], cozy["adapter"], cozy["serving"]) == ("cozy", serving["cozy"], 0)
    assert [v["version"] for v in cozy["data"] if v["serving"]] == [serving["cozy"]]
    night = http.get("/admin/versions", headers=ADMIN, params={"segment": "night"}).json()
    assert [(v["version"], v["serving"]) for v in night["data"]] == [(serving["night"], True)]
    base = http.get("/admin/versions", headers=ADMIN, params={"segment": "base"}).json()
    assert [(v["version"], v["segment"], v["serving"]) for v in base["data"]] == [(0, None, True)]
    overflow = http.get("/admin/versions", headers=ADMIN, params={"segment": "overflow"}).json()
    assert overflow["data"] == [] and overflow["adapter"] is None  # configured, nothing published yet
    r = http.get("/admin/versions", headers=ADMIN, params={"segment": "evening"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "segment"
    public = http.get("/v1/versions", headers=USER).json()["data"]
    assert sorted((v["segment"] or "base") for v in public) == ["base", "cozy", "cozy", "night"]


def test_a_segments_rollback_moves_only_that_segment(http, store):
    serving = _serving(http)
    cozy = [v["version"] for v in http.get("/admin/versions", headers=ADMIN, params={"segment": "cozy"}).json()["data"]]
    cozy1, cozy2 = cozy
    assert serving["cozy"] == cozy2

    # a version of another lineage cannot serve this segment
    r = http.post("/admin/rollback", headers=ADMIN, json={"version": serving["night"], "segment": "cozy"})
    assert r.status_code == 409 and r.json()["error"]["param"] == "version", r.text

    # to the older adapter (the segment is the version's own)
    r = http.post("/admin/rollback", headers=ADMIN, json={"version": cozy1, "reason": "cozy2 is worse"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["version"], body["previous"], body["rolled_back"], body["segment"]) == ("rollback", cozy1, cozy2, [cozy2], "cozy")
    assert _serving(http) == {"cozy": cozy1, "night": serving["night"], "overflow": None}
    reply = _chat(http, "cozy")
    assert reply["policy_version"] == cozy1 and _recorded(store, reply) == ("cozy", cozy1)
    assert store.versions.cursor_version("sao:cozy") == cozy1 and store.versions.cursor_version("sao:night") == serving["night"]

    # to the base weights: the segment is served without an adapter, the others keep theirs
    r = http.post("/admin/rollback", headers=ADMIN, json={"version": 0, "segment": "cozy"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["version"], body["previous"], body["segment"]) == (0, cozy1, "cozy")
    state = _adapters(http)
    assert (state["cozy"]["serving"], state["cozy"]["policy_version"]) == (None, 0)
    assert state["night"]["serving"] == serving["night"]
    reply = _chat(http, "cozy")
    assert reply["policy_version"] == 0 and _recorded(store, reply) == ("cozy", 0)
    assert _chat(http, "night")["policy_version"] == serving["night"]
    statuses = _statuses(http)
    assert (statuses[0], statuses[cozy2], statuses[serving["night"]]) == ("serving", "rolled_back", "serving")
    assert http.get("/admin/stats", headers=ADMIN).json()["serving"] == 0  # the base weights never moved
    r = http.post("/admin/rollback", headers=ADMIN, json={"version": 0, "segment": "cozy"})
    assert r.status_code == 409, r.text  # the base serves cozy already

    events = [e for e in http.get("/admin/events", headers=ADMIN).json()["data"] if e["kind"] == "rollback"]
    assert [(e["version"], e["detail"]["segment"], e["detail"]["learner"]) for e in events] == [(cozy1, "cozy", "sao:cozy"), (0, "cozy", "sao:cozy")]


def _cli(server, *args: str) -> str:
    config = Path(server.log_path).parent / "config.toml"
    done = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), *args, "--base-url", server.base_url],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LIVELOOP_ADMIN_KEY": ADMIN_KEY},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_cli_shows_and_moves_one_segment(http, server):
    night = _serving(http)["night"]
    table = _cli(server, "adapters")
    lines = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert lines["cozy"][:4] == ["cozy", "base", "no", "2"] and lines["night"][:4] == ["night", f"v{night}", "no", "1"]
    assert lines["overflow"][:4] == ["overflow", "base", "no", "0"]

    listed = _cli(server, "versions", "--segment", "night")
    assert f"v{night} *" in listed and "night" in listed and "cozy" not in listed

    out = _cli(server, "learning", "pause", "--segment", "night", "--reason", "from the CLI")
    assert out.strip() == "learner sao:night: paused"
    assert _adapters(http)["night"]["paused"] and not _adapters(http)["cozy"]["paused"]
    out = _cli(server, "rollback", "0", "--segment", "night")
    assert out.startswith(f"segment night: serving v0 (was v{night})")
    assert _serving(http)["night"] is None
    assert _cli(server, "learning", "resume", "--segment", "night").strip() == "learner sao:night: running"


def test_dashboard_adapters_panel(http, server, store, browser, adapter_dirs):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    night2 = _publish(store, adapter_dirs["night1"], "night", parent=0)  # night's lane goes on from the base
    _wait_activated(http, "night", night2, "the watcher to activate night's new adapter")
    # the page re-renders every 2 s: an element found a moment ago may be replaced
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])
    browser.get(server.base_url + "/dashboard")
    browser.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "sign-in").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")

    assert browser.find_element(By.ID, "adapters-panel").is_displayed()
    assert browser.find_element(By.CSS_SELECTOR, "#versions thead th.segment-col").is_displayed()
    def listed(d) -> list[str]:
        return [r.get_attribute("data-segment") for r in d.find_elements(By.CSS_SELECTOR, "#adapters tbody tr")]

    wait.until(lambda d: listed(d) == ["cozy", "night", "overflow"])
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#adapters tr[data-segment="night"]').get_attribute("data-serving") == str(night2))
    artifacts = Path(os.environ.get("LIVELOOP_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(artifacts / "dashboard-adapters.png"))

    # pause one segment from its row: only its switch flips
    wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, '#adapters button.segment-pause[data-segment="cozy"]'))).click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#adapters button.segment-resume[data-segment="cozy"]'))
    state = _adapters(http)
    assert state["cozy"]["paused"] and not state["night"]["paused"]

    # serve night the base again from its row (after the confirmation): the other segments keep theirs
    wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, '#adapters button.segment-base[data-segment="night"]'))).click()
    wait.until(EC.alert_is_present()).accept()
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#adapters tr[data-segment="night"]').get_attribute("data-serving") == "")
    assert _serving(http) == {"cozy": None, "night": None, "overflow": None}
    assert _statuses(http)[night2] == "rolled_back"
    assert http.post("/admin/learning/resume", headers=ADMIN, json={"segment": "cozy"}).json()["changed"]
