"""The evaluation end to end on a real server process (hf engine, SQLite, the release gate in immediate
mode with a small suite): a version an operator publishes is evaluated off the serving path, `liveloop
evaluation V` prints it, and the dashboard in a real headless Chromium shows its checks in the
evaluation panel and its verdict on its row of the version table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import immediate_evaluation, perturbed_checkpoint, wait_until

from .conftest import ADMIN_KEY, ROOT, start_server, stop_server
from .test_operator import browser  # noqa: F401 (the headless Chromium fixture)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("evaluation-server")
    extra = immediate_evaluation(work)
    server = start_server(work / "srv", model_dir, "hf", extra=extra)
    yield server
    stop_server(server)


@pytest.mark.slow
def test_published_version_evaluated_shown_by_cli_and_dashboard(server, browser, tmp_path):  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    with httpx.Client(base_url=server.base_url, headers=ADMIN, timeout=120) as http:
        r = http.post("/admin/weights", json={"path": str(perturbed_checkpoint(server.model_dir, tmp_path / "v", seed=4, scale=0.2))})
        assert r.status_code == 200, r.text
        version = r.json()["version"]
        wait_until(lambda: http.get(f"/admin/versions/{version}/evaluation").status_code == 200, timeout=180,
                   what=f"the evaluation of v{version}")
        body = http.get(f"/admin/versions/{version}/evaluation").json()

    config = Path(server.log_path).parent / "config.toml"
    done = subprocess.run([sys.executable, "-m", "liveloop.cli", "evaluation", "--config", str(config), "--base-url", server.base_url, str(version)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "LIVELOOP_ADMIN_KEY": ADMIN_KEY})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"v{version} against live v{version}: ") and all(c["name"] in done.stdout for c in body["checks"])

    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])
    browser.get(server.base_url + "/dashboard")
    wait.until(EC.presence_of_element_located((By.ID, "key"))).send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "sign-in").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")
    panel = browser.find_element(By.ID, "evaluation-panel")
    assert panel.get_attribute("data-version") == str(version) and panel.get_attribute("data-passed") == str(body["passed"]).lower()
    shown = [r.get_attribute("data-check") for r in browser.find_elements(By.CSS_SELECTOR, "#evaluation tbody tr")]
    assert shown == [c["name"] for c in body["checks"]]
    cell = browser.find_element(By.CSS_SELECTOR, f'#versions tbody tr[data-version="{version}"] td.evaluation').text
    assert cell == ("passed" if body["passed"] else "failed: " + ", ".join(body["failed"]))
    assert browser.find_element(By.CSS_SELECTOR, '#versions tbody tr[data-version="0"] td.evaluation').text == "–"
    artifacts = Path(os.environ.get("LIVELOOP_ARTIFACTS", ROOT / "tests" / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(artifacts / "dashboard-evaluation.png"))
