"""The operator console end to end, on one real server (vLLM engine, co-located learner, SQLite):
admin routes refuse non-admin keys; the drift monitor raises an alarm when users' ratings turn;
rollback serves the old version's weights again (byte-identical logprobs); the dashboard works in a
real headless Chromium (sign in, chart shows the versions, the rollback button rolls back; a
screenshot is saved); pausing stops version publishing while serving continues.

The tests share the server and run in file order; each one reads the state it needs from the API
instead of assuming version numbers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import perturbed_checkpoint, wait_until

from .conftest import ADMIN_KEY, ROOT, USER_KEY, open_store, start_server, stop_server

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {USER_KEY}"}
LEARNER = """
batch_size = 1
publish_every_steps = 2
publish_every_seconds = 1.0
kl_coef = 0.0
poll_seconds = 0.05
"""
MONITOR = """
[monitor]
poll_seconds = 0.2
window_seconds = 2.0
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("operator-server"), model_dir, "vllm", learner=LEARNER, extra=MONITOR)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        client.post("/admin/learning/pause", headers=ADMIN, json={"reason": "tests start paused"}).raise_for_status()
        yield client


def _chat(http: httpx.Client, text: str, seed: int | None = None, topic: str = "cats", max_tokens: int = 8) -> dict:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "metadata": {"topic": topic}}
    if seed is not None:
        body["seed"] = seed
    r = http.post("/v1/chat/completions", headers=USER, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _rate(http: httpx.Client, reply: dict, reward: int) -> None:
    r = http.post("/v1/feedback", headers=USER, json={"response_id": reply["id"], "reward": reward})
    assert r.status_code == 200, r.text


def _serving(http: httpx.Client) -> int:
    return http.get("/admin/stats", headers=ADMIN).json()["serving"]



ROUTES = [
    ("GET", "/admin/versions", None), ("GET", "/admin/drift", None), ("GET", "/admin/stats", None),
    ("GET", "/admin/events", None), ("GET", "/admin/learner", None), ("POST", "/admin/learning/pause", {}),
    ("POST", "/admin/learning/resume", {}), ("POST", "/admin/rollback", {"version": 0}),
]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_admin_routes_refuse_non_admin_keys(http, method, path, body):
    for headers, status in ((USER, 403), ({}, 401), ({"Authorization": "Bearer sk-nope"}, 401)):
        r = http.request(method, path, headers=headers, json=body)
        assert r.status_code == status, (path, r.text)
        assert r.json()["error"]["code"] in ("insufficient_permissions", "invalid_api_key")
    assert http.get("/admin/stats", headers=ADMIN).json()["learning_paused"]  # nothing above changed state


def test_bad_rollback_requests_are_clear_4xx(http):
    serving = _serving(http)
    for body, status in (({"version": -1}, 400), ({"version": "1"}, 400), ({}, 400), ({"version": 999}, 404), ({"version": serving}, 409)):
        r = http.post("/admin/rollback", headers=ADMIN, json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["message"]
    assert _serving(http) == serving


def test_drift_alarm_when_ratings_turn(http, server):
    # cats users like what they get, then stop liking it; dogs users rate evenly throughout
    for i in range(140):
        reply = _chat(http, f"Tell me about cats ({i}).", max_tokens=4)
        _rate(http, reply, 1 if i < 70 else 0)
        if i % 2:
            _rate(http, _chat(http, f"Tell me about dogs ({i}).", topic="dogs", max_tokens=4), int(i % 4 == 1))

    def caught_up():
        drift = http.get("/admin/drift", headers=ADMIN).json()
        return drift if drift["overall"]["ratings"] == 210 else None

    drift = wait_until(caught_up, 20, "the monitor to read every rating")
    (alarm,) = [a for a in drift["alarms"] if a["segment"] == "cats" and a["direction"] == "down"]
    assert 70 < alarm["index"] <= 140 and alarm["before"] > 0.5 and alarm["after"] < 0.5
    assert "dogs" not in {a["segment"] for a in drift["alarms"]}
    assert drift["segments"]["cats"]["n"] == 140 and sum(b["n"] for b in drift["series"]) == 210
    events = http.get("/admin/events", headers=ADMIN).json()["data"]
    assert any(e["kind"] == "alarm" and e["detail"]["segment"] == "cats" for e in events)
    metrics = http.get("/metrics", headers=ADMIN).text
    assert 'liveloop_monitor_alarms_total{direction="down",segment="cats"}' in metrics
    assert "liveloop_monitor_reward_rate{" in metrics


def _seeded(http: httpx.Client, n: int = 3) -> list[dict]:
    return [_chat(http, f"Write about the moon, please ({i}).", seed=100 + i, max_tokens=24) for i in range(n)]


def _logged(server, replies: list[dict]) -> list[tuple[bytes, bytes, int]]:
    store = open_store(server)
    try:
        rows = [store.feedback.get_response(r["id"]) for r in replies]
        return [(r.response_ids.tobytes(), r.behavior_logprobs.tobytes(), r.policy_version) for r in rows]
    finally:
        store.close()


def test_rollback_serves_the_old_weights_byte_identical(http, server, tmp_path):
    old = _serving(http)
    before = _logged(server, _seeded(http))
    swapped = http.post("/admin/weights", headers=ADMIN, json={"path": str(perturbed_checkpoint(server.model_dir, tmp_path / "bad")), "note": "a bad version"})
    assert swapped.status_code == 200, swapped.text
    bad = swapped.json()["version"]
    during = _logged(server, _seeded(http))
    assert all(v == bad for _, _, v in during) and [lp for _, lp, _ in during] != [lp for _, lp, _ in before]

    r = http.post("/admin/rollback", headers=ADMIN, json={"version": old, "reason": "worse than its parent"})
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["previous"], r.json()["rolled_back"]) == (old, bad, [bad])
    after = _logged(server, _seeded(http))
    assert after == before  # same tokens, byte-identical logprobs, recorded under the old version
    versions = {v["version"]: v for v in http.get("/admin/versions", headers=ADMIN).json()["data"]}
    assert versions[bad]["status"] == "rolled_back" and versions[old]["status"] == "serving" and versions[old]["serving"]
    assert versions[bad]["parent"] == old and versions[bad]["responses"] == 3
    wait_until(lambda: http.get("/admin/learner", headers=ADMIN).json().get("version") == old, 30, "the learner to reload the rolled-back-to version")
    assert "liveloop_server_rollbacks_total 1.0" in http.get("/metrics", headers=ADMIN).text


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("LIVELOOP_REQUIRE_BROWSER"):
            pytest.fail("Debian's chromium and chromium-driver are missing: scripts/test.sh installs them")
        pytest.skip("no /usr/bin/chromium: run through scripts/test.sh")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1500",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_dashboard_in_a_real_browser(http, server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    target = _serving(http)
    swapped = http.post("/admin/weights", headers=ADMIN, json={"path": str(perturbed_checkpoint(server.model_dir, tmp_path / "v", seed=7)), "note": "to roll back from the page"})
    newer = swapped.json()["version"]
    from selenium.common.exceptions import StaleElementReferenceException

    # the page re-renders (sign-in reload, 2 s refresh): an element found a moment ago may be replaced
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])

    browser.get(server.base_url + "/dashboard")
    _act(wait, By.ID, "key", lambda e: e.send_keys("sk-wrong"))
    _act(wait, By.ID, "sign-in", lambda e: e.click())
    wait.until(lambda d: "not an admin key" in d.page_source)  # the form answers 401 with the page again
    _act(wait, By.ID, "key", lambda e: e.send_keys(ADMIN_KEY))
    _act(wait, By.ID, "sign-in", lambda e: e.click())
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")

    # the reward chart is drawn (uPlot canvas) with a marker per version that went live
    assert browser.find_elements(By.CSS_SELECTOR, "#reward-chart canvas")
    markers = _read(wait, lambda d: {m.get_attribute("data-version") for m in d.find_elements(By.CSS_SELECTOR, "#version-markers li.version")})
    assert {str(newer), str(target)} <= markers
    rows = _read(wait, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#versions tbody tr")))
    listed = http.get("/admin/versions", headers=ADMIN).json()["data"]
    assert rows == len(listed)
    assert _read(wait, lambda d: d.find_element(By.ID, "serving").get_attribute("data-version")) == str(newer)
    assert browser.execute_script("return window.dashboard.markers.filter(m => m.kind === 'alarm').length") >= 1
    # the fleet panel: this server is a fleet of one, up, serving the newest version
    fleet = _read(wait, lambda d: [(r.get_attribute("data-serving"), r.get_attribute("class")) for r in d.find_elements(By.CSS_SELECTOR, "#fleet tbody tr.replica")])
    assert len(fleet) == 1 and fleet[0][0] == str(newer) and "up" in fleet[0][1]

    artifacts = Path(os.environ.get("LIVELOOP_ARTIFACTS", ROOT / "tests" / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(artifacts / "dashboard.png"))

    # a refresh that changes nothing keeps the page's elements: a button is not re-created under the pointer
    button = browser.find_element(By.CSS_SELECTOR, f'#versions button.rollback[data-version="{target}"]')
    refreshes = browser.execute_script("return window.dashboard.refreshes")
    wait.until(lambda d: d.execute_script("return window.dashboard.refreshes") >= refreshes + 2)
    assert button.is_enabled()  # raises StaleElementReferenceException had the row been drawn again

    # roll back from the page: the button on the target's row, then confirm
    _act(wait, By.CSS_SELECTOR, f'#versions button.rollback[data-version="{target}"]', lambda e: e.click())
    wait.until(EC.alert_is_present()).accept()
    wait.until(lambda d: d.find_element(By.ID, "serving").get_attribute("data-version") == str(target))
    assert _serving(http) == target
    status = {v["version"]: v["status"] for v in http.get("/admin/versions", headers=ADMIN).json()["data"]}
    assert status[newer] == "rolled_back"
    browser.save_screenshot(str(artifacts / "dashboard-after-rollback.png"))

    # the page's own writes need its header: a cookie alone (a cross-site form) cannot pause
    cookie = browser.get_cookie("liveloop_session")["value"]
    with httpx.Client(base_url=server.base_url, cookies={"liveloop_session": cookie}) as forger:
        forged = forger.post("/admin/learning/resume")
    assert forged.status_code == 403 and http.get("/admin/stats", headers=ADMIN).json()["learning_paused"]


def _act(wait, by, locator, action):
    """Finds an element and acts on it as one step, again if the page drew it anew in between."""
    wait.until(lambda d: action(d.find_element(by, locator)) or True)


def _read(wait, read):
    """What read(driver) returns, read again if the page drew an element anew while it was read."""
    box = []
    wait.until(lambda d: box.append(read(d)) or True)
    return box[-1]


def _cli(server, *args: str) -> str:
    config = Path(server.log_path).parent / "config.toml"
    done = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "LIVELOOP_ADMIN_KEY": ADMIN_KEY},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_cli_versions_rollback_and_report(http, server, tmp_path):
    serving = _serving(http)
    table = _cli(server, "versions", "--base-url", server.base_url)
    assert f"v{serving} *" in table and "rolled_back" in table
    target = next(v["version"] for v in http.get("/admin/versions", headers=ADMIN).json()["data"] if v["version"] != serving)
    out = _cli(server, "rollback", str(target), "--base-url", server.base_url, "--reason", "from the CLI")
    assert out.startswith(f"serving v{target} (was v{serving})") and _serving(http) == target
    wrong = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "rollback", "12345", "--base-url", server.base_url, "--api-key", USER_KEY],
        capture_output=True, text=True, timeout=120,
    )
    assert wrong.returncode == 1 and "HTTP 403" in wrong.stderr
    for name in ("report.png", "report.html"):
        out = _cli(server, "report", "drift", "--since", "1h", "--out", str(tmp_path / name))
        assert out.startswith(f"wrote {tmp_path / name}: 2") and (tmp_path / name).stat().st_size > 10_000
    page = (tmp_path / "report.html").read_text()
    assert "cats" in page and "rolled_back" in page and "data:image/png;base64," in page
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pause_stops_publishing_while_serving_continues(http, server):
    assert http.get("/admin/stats", headers=ADMIN).json()["learning_paused"]
    store = open_store(server)
    try:
        before = len(store.versions.list_versions())
        served = _serving(http)
        for i in range(8):
            _rate(http, _chat(http, f"Tell me about tea ({i})."), i % 2)
        time.sleep(3)  # > publish_every_seconds: an unpaused learner would have published by now
        assert len(store.versions.list_versions()) == before and _serving(http) == served
        learner = http.get("/admin/learner", headers=ADMIN).json()
        assert learner["running"] and learner["paused"]

        r = http.post("/admin/learning/resume", headers=ADMIN, json={"reason": "done looking"})
        assert r.json() == {"object": "learning", "learner": "sao", "paused": False, "changed": True}
        newest = wait_until(lambda: _serving(http) > served and _serving(http), 90, "the learner to publish after resume")
        record = store.versions.get_version(newest)
        assert record.parent is not None and record.samples_used >= 1
        kinds = [e["kind"] for e in http.get("/admin/events", headers=ADMIN).json()["data"]]
        assert kinds.count("pause") >= 1 and kinds[-1] in ("resume", "alarm")
    finally:
        store.close()
