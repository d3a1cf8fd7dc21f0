"""The release modes end to end: a real `liveloop serve` (hf engine, tiny model, SQLite) in canary mode,
driven by the official `openai` client sending `user=`, rated through `/v1/feedback`; versions are
published into its store the way a learner in another process publishes them (`liveloop learn`). The
canary users, and only they, are served the candidate, each user one version consistently; once its
users have rated it and its evaluation passed it is promoted and every user is served it; the
newest version published meanwhile is the next candidate. GET /admin/release shows it all along."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from liveloop.devtools import key_id, perturbed_checkpoint, wait_until
from liveloop.release.routing import in_canary, user_key
from liveloop.store import VersionStatus

from .conftest import ADMIN_KEY, CANARY_FRACTION, CANARY_RELEASE, USER_KEY, open_store, publish_version, start_server, stop_server

pytestmark = pytest.mark.slow
MODEL = "liveloop-tiny"
USERS = [f"person-{i}" for i in range(24)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    s = start_server(tmp_path_factory.mktemp("release-canary"), model_dir, "hf", extra=CANARY_RELEASE)
    yield s
    stop_server(s)


def _chat(oai: openai.OpenAI, user: str) -> tuple[str, int]:
    resp = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me about cats."}], max_tokens=4, user=user)
    return resp.id, resp.model_extra["policy_version"]


def test_canary_serves_its_users_the_candidate_then_promotes_it(server, tmp_path):
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    admin = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    user = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {USER_KEY}"}, timeout=30)
    store = open_store(server)
    try:
        canary_users = {u for u in USERS if in_canary(user_key(u, key_id(USER_KEY), "user"), CANARY_FRACTION)}
        assert 0 < len(canary_users) < len(USERS)
        for u in USERS[:8]:  # the live version's ratings
            rid, version = _chat(oai, u)
            assert version == 0
            assert user.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200

        v1 = publish_version(store, 0, perturbed_checkpoint(server.model_dir, tmp_path / "c1", seed=1))
        wait_until(lambda: admin.get("/admin/release").json()["candidate"] is not None, 60, "a candidate")
        body = admin.get("/admin/release").json()
        assert body["mode"] == "canary" and body["candidate"]["version"] == v1 and body["serving"] == 0
        wait_until(lambda: admin.get("/admin/release").json()["candidate"]["loaded"], 60, "the candidate loaded")

        seen: dict[str, set[int]] = {u: set() for u in USERS}
        on_candidate = []
        for _ in range(2):
            for u in USERS:
                rid, version = _chat(oai, u)
                seen[u].add(version)
                if version == v1:
                    on_candidate.append(rid)
        assert {u for u, vs in seen.items() if vs == {v1}} == canary_users  # the canary users, only they
        assert all(vs == {0} for u, vs in seen.items() if u not in canary_users)
        for rid in on_candidate:  # its users like it: it is promoted once evaluated
            assert user.post("/v1/feedback", json={"response_id": rid, "reward": 1}).status_code == 200

        v2 = publish_version(store, v1, perturbed_checkpoint(server.model_dir, tmp_path / "c2", seed=2))  # trained on from the candidate
        wait_until(lambda: store.versions.get_version(v1).status == VersionStatus.SERVING, 120, f"version {v1} promoted")
        assert store.release.evaluation(v1) is not None and store.release.evaluation(v1).passed
        assert {_chat(oai, u)[1] for u in USERS if u not in canary_users} == {v1}
        wait_until(lambda: store.versions.get_version(v2).status == VersionStatus.CANARY, 60, f"version {v2} the next candidate")
        wait_until(lambda: admin.get("/admin/release").json()["candidate"]["loaded"], 60, "the next candidate loaded")
        assert {_chat(oai, u)[1] for u in canary_users} == {v2}  # the same users try the next one
        assert {_chat(oai, u)[1] for u in USERS if u not in canary_users} == {v1}
    finally:
        store.close()
        admin.close()
        user.close()
