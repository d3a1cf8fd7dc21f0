"""A real server with its co-located learner publishing through shared memory (the fast path): every
version the learner publishes carries the nonce and digest of its handle in its row, its memory sits
in the deployment's private directory (named by the store's random deployment id), the server swaps it
in from there after verifying it, and nothing is rejected. A foreign file planted in the namespace is
reported at the next start, and the restarted server goes on swapping versions in."""

from __future__ import annotations

import os
import stat

import httpx
import pytest

from liveloop.devtools import wait_until
from liveloop.store import VersionStatus
from liveloop.transport import shared_memory as shm

from .conftest import FAST_LEARNER, MOON, SHM_TRANSPORT, USER_KEY, open_store, start_server, stop_server

pytestmark = pytest.mark.slow


def _rate(c: httpx.Client, n: int) -> None:
    for i in range(n):
        rid = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MOON, "max_tokens": 8}).json()["id"]
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": i % 2}).status_code == 200


def _serving(store) -> int:
    record = store.versions.latest_version(VersionStatus.SERVING)
    return record.version if record else 0


def test_versions_swap_in_from_verified_private_memory(tmp_path, model_dir):
    workdir = tmp_path / "srv"
    server = start_server(workdir, model_dir, "hf", learner=FAST_LEARNER, extends="tuned_learner", extra=SHM_TRANSPORT)
    store = open_store(server)
    namespace = f"d{store.fleet.deployment_id()[:15]}"
    try:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60) as c:
            _rate(c, 3)
            wait_until(lambda: _serving(store) >= 2, 180, "two learner versions to swap in")
        assert "from shared_memory" in server.log_tail(200000)
        published = [r for r in store.versions.list_versions() if r.version > 0 and r.status != VersionStatus.FAILED]
        assert published and all(r.weights_nonce and r.weights_digest for r in published)
        assert not [e for e in store.operator.events() if e.kind == "weights_rejected"]
        folder = shm.directory(namespace)
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700 and stat.S_IMODE(os.lstat(folder.parent).st_mode) == 0o700
    finally:
        stop_server(server)
    (shm.directory(namespace) / "planted").write_bytes(b"not ours")  # between two runs of the deployment
    again = start_server(workdir, model_dir, "hf", learner=FAST_LEARNER, extends="tuned_learner", extra=SHM_TRANSPORT, store_url=server.store_url)
    try:
        (event,) = [e for e in store.operator.events() if e.kind == "foreign_weights"]
        assert [os.path.basename(f["path"]) for f in event.detail["files"]] == ["planted"]
        before = _serving(store)
        with httpx.Client(base_url=again.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60) as c:
            _rate(c, 2)
            wait_until(lambda: _serving(store) > before, 180, "the restarted server to swap a new version in")
        assert not [e for e in store.operator.events() if e.kind == "weights_rejected"]
    finally:
        stop_server(again)
        store.close()
        for version in shm.segments(namespace):
            shm.remove_version(namespace, version)
        (shm.directory(namespace) / "planted").unlink(missing_ok=True)
