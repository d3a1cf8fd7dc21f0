"""Issue 46.4: an operator rolls back under traffic on the shipped default (the tiny preset over
configs/serve/default.toml: shared-memory transport, coalesced versions). One user asks and rates
replies in a loop while the operator rolls back to the serving version's parent eight times: every
rollback is done (none 409 "durable checkpoint ... not written yet"), and none is undone (what serves
next descends from the version rolled back to). The lineage says which versions a rollback can read
(`checkpoint`, `rollback_target`): once the ratings stop, every version published in memory, the
superseded ones included, has its durable checkpoint or is not offered. Waits are hang guards."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .conftest import ADMIN_KEY, USER_KEY, start_server, stop_server

ROLLBACKS = 8
GUARD_SECONDS = 180  # a hang guard for each wait: a loaded machine is slower, never a different verdict


@pytest.fixture
def server(tmp_path, model_dir):
    server = start_server(tmp_path, model_dir, "hf", learner="", extends="tiny")
    yield server
    stop_server(server)


def _rate_until(base_url: str, stop: threading.Event, rated: list[int], errors: list[str]) -> None:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120, trust_env=False) as c:
        for i in range(100_000):  # bounded; ends when the test says so
            if stop.is_set():
                return
            r = c.post("/v1/chat/completions", json={
                "model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me about the sea ({i})."}],
                "max_tokens": 8, "seed": i,
            })
            if r.status_code != 200:
                errors.append(f"chat {r.status_code}: {r.text[:200]}")
                return
            f = c.post("/v1/feedback", json={"response_id": r.json()["id"], "reward": i % 2})
            if f.status_code != 200:
                errors.append(f"feedback {f.status_code}: {f.text[:200]}")
                return
            rated.append(f.json()["id"])


def _versions(admin: httpx.Client) -> dict[int, dict]:
    body = admin.get("/admin/versions").json()
    return {v["version"]: v for v in body["data"] if v["segment"] is None}


def _descends(versions: dict[int, dict], version: int, ancestor: int) -> bool:
    for _ in range(len(versions) + 1):
        if version == ancestor:
            return True
        parent = versions.get(version, {}).get("parent")
        if parent is None:
            return False
        version = parent
    return False


def test_rollbacks_to_the_serving_parent_under_ratings_are_all_done(server):
    stop, rated, errors = threading.Event(), [], []
    rater = threading.Thread(target=_rate_until, args=(server.base_url, stop, rated, errors), daemon=True)
    rater.start()
    done, refused, offered = [], [], []
    admin = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=300, trust_env=False)
    try:
        last = 0  # the newest version when the last rollback was asked
        for k in range(ROLLBACKS):
            # the learner trains on: the serving version's parent is a version it published after the last
            # rollback (not the version rolled back to, whose checkpoint a rollback has read already)
            deadline = time.monotonic() + GUARD_SECONDS
            while True:
                assert not errors, errors
                versions = _versions(admin)
                serving = next((v for v in versions.values() if v["serving"]), None)
                if serving is not None and serving["parent"] is not None and serving["parent"] > last:
                    break
                assert time.monotonic() < deadline, f"no new version served (rated {len(rated)}):\n{server.log_tail()}"
                time.sleep(0.1)
            target = serving["parent"]
            offered.append(versions[target].get("rollback_target"))  # does the lineage offer the operator's first move?
            r = admin.post("/admin/rollback", json={"version": target, "reason": f"under traffic {k}"})
            if r.status_code != 200:
                refused.append((serving["version"], target, r.status_code, r.text))
                last = max(versions)
                continue
            done.append(target)
            last = max(versions)
            assert serving["version"] in r.json()["rolled_back"]
            # not undone: what serves now is the version rolled back to or a descendant of it (never the rolled-back line)
            now = _versions(admin)
            current = next(v["version"] for v in now.values() if v["serving"])
            assert _descends(now, current, target), (k, target, current)
            assert all(now[v]["status"] == "rolled_back" for v in r.json()["rolled_back"])
    finally:
        stop.set()
        rater.join(GUARD_SECONDS)
    assert not errors, errors
    assert not refused, f"{len(done)} of {ROLLBACKS} rollbacks done; refused: {refused}"
    assert len(rated) > ROLLBACKS  # the rollbacks happened under ratings
    assert all(offered), offered  # each target was offered as one
    # with the ratings stopped the learner idles: no version stays "writing" (a hang guard bounds the wait)
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        versions = _versions(admin)
        if not any(v["checkpoint"] == "writing" for v in versions.values()):
            break
        assert time.monotonic() < deadline, {v: x["checkpoint"] for v, x in versions.items()}
        time.sleep(0.1)
    for v in versions.values():  # superseded (and every other) version: a durable checkpoint, or not offered
        assert v["checkpoint"] == "durable" or not v["rollback_target"], v
    admin.close()
