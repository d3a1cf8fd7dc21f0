"""A server killed with SIGKILL while a candidate is in canary comes back serving what the store says: the
candidate is still the store's CANARY version, its users (and only they) are served it again after the
restart, everyone else the live version, and the restarted gate decides it (promotes it once its users
have rated it). A real `liveloop serve`
(hf engine, tiny model, SQLite) in canary mode, driven by the official `openai` client with `user=`; the
candidate is published into its store the way a learner in another process publishes one."""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from liveloop.devtools import key_id, perturbed_checkpoint, wait_until
from liveloop.release.routing import in_canary, user_key
from liveloop.store import VersionStatus

from .conftest import ADMIN_KEY, CANARY_FRACTION, CANARY_RELEASE, USER_KEY, open_store, publish_version, start_server, stop_server

pytestmark = pytest.mark.slow
MODEL = "liveloop-tiny"
USERS = [f"person-{i}" for i in range(16)]


def _ask(oai: openai.OpenAI) -> dict[str, tuple[str, int]]:
    """Each user asks once: user -> (response id, the version that served it)."""
    out = {}
    for u in USERS:
        resp = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me about cats."}], max_tokens=4, user=u)
        out[u] = resp.id, resp.model_extra["policy_version"]
    return out


def _versions(asked: dict[str, tuple[str, int]]) -> dict[str, int]:
    return {u: version for u, (_, version) in asked.items()}


def _candidate_loaded(admin: httpx.Client, version: int) -> bool:
    candidate = admin.get("/admin/release").json()["candidate"]
    return candidate is not None and candidate["version"] == version and candidate["loaded"]


def test_a_killed_server_comes_back_with_the_stores_candidate(tmp_path, model_dir):
    workdir = tmp_path / "srv"
    canary_users = {u for u in USERS if in_canary(user_key(u, key_id(USER_KEY), "user"), CANARY_FRACTION)}
    assert 0 < len(canary_users) < len(USERS)
    server = start_server(workdir, model_dir, "hf", extra=CANARY_RELEASE)
    store = open_store(server)
    try:
        candidate = publish_version(store, 0, perturbed_checkpoint(model_dir, tmp_path / "c1", seed=1))  # rated only after the restart
        with httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as admin:
            wait_until(lambda: _candidate_loaded(admin, candidate), 90, "the candidate loaded")
        before = _versions(_ask(openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)))
        assert {u for u, v in before.items() if v == candidate} == canary_users
        os.killpg(server.proc.pid, signal.SIGKILL)  # no shutdown hook runs
        server.proc.wait(30)
        assert store.versions.get_version(candidate).status == VersionStatus.CANARY

        server = start_server(workdir, model_dir, "hf", extra=CANARY_RELEASE)
        with httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as admin:
            wait_until(lambda: _candidate_loaded(admin, candidate), 90, "the candidate loaded again")
            release = admin.get("/admin/release").json()
        assert release["serving"] == 0 and release["mode"] == "canary"
        oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
        asked = [_ask(oai), _ask(oai)]
        assert all(_versions(a) == before for a in asked)  # each user is served what the store says, as before the kill
        assert store.versions.get_version(candidate).status == VersionStatus.CANARY and store.versions.latest_version().version == 0
        with httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {USER_KEY}"}, timeout=30) as user:
            for a in asked:  # everyone likes what they got: the restarted gate promotes the candidate
                for rid, _ in a.values():
                    assert user.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200
        wait_until(lambda: store.versions.get_version(candidate).status == VersionStatus.SERVING, 120, "the candidate promoted after the restart")
        assert set(_versions(_ask(oai)).values()) == {candidate}
    finally:
        store.close()
        stop_server(server)
