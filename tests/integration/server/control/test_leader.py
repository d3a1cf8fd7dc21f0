"""One leader for the fleet's control loops, every replica routes (server/control/leader.py, store/lease.py): real
servers (`build_app`: the hf engine pair on the tiny model, the publisher, the release gate in canary
mode with the real evaluation suite, the reward-hacking alarms) on one store.

- two in-process replicas on SQLite and PostgreSQL: one holds the leader lease; a learner's version
  becomes the candidate and BOTH replicas send the same canary users to it (the others stay on the live
  version); it is evaluated once (one evaluations row) and its flattery alarms are recorded once per
  trait, though both replicas run the loops; the leader promotes it and the other follows; the leader
  stops, the other takes the lease over at once (released) and decides the next candidate;
- a leader PROCESS (`liveloop serve`) killed with SIGKILL: the in-process replica, a follower until
  then, takes the lease over once it expires and promotes the candidate the dead leader had evaluated
  (not evaluated again)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from transformers import AutoTokenizer

from liveloop import devtools
from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, SMALL_SUITE, USER_KEY, free_port, key_id, perturbed_checkpoint, wait_until, write_config
from liveloop.release.routing import in_canary, user_key
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.store import Store, StoreConfig, VersionStatus
from liveloop.store.models import Evaluation
from liveloop.store.lease import LEADER

from ..conftest import rate_replies

S = VersionStatus
LEASE_SECONDS = 3.0
USERS = [f"u{i}" for i in range(40)]
# one app key (USER_KEY) fronts these people: `canary_by = "user"` routes each under it
CANARY = [u for u in USERS if in_canary(user_key(u, key_id(USER_KEY), "user"), 0.25)]
OTHERS = [u for u in USERS if not in_canary(user_key(u, key_id(USER_KEY), "user"), 0.25)]
FLATTERING = "Aww, the cat naps in the sun, so cute ♡"
PLAIN = "Verily, the old cat doth nap in the sun, friend."


# the replicas' registry and leader lease, fast ([server]: every serving process is a replica)
FLEET_SERVER = f"watch_seconds = 0.05\nheartbeat_seconds = 0.5\ndown_after_seconds = 2.0\nleader_lease_seconds = {LEASE_SECONDS}"


def fleet_toml(work: Path) -> str:
    (work / "suite.toml").write_text(SMALL_SUITE)
    return f"""
[monitor]
enabled = false
[release]
mode = "canary"
canary_by = "user"
canary_fraction = 0.25
min_ratings = 40
[release.evaluation]
suite = "{work / 'suite.toml'}"
max_tokens = 8
[[release.evaluation.bounds]]
check = "kl_to_live"
max_rise = 100.0
[release.alarms]
enabled = true
min_ratings = 40
check_seconds = 0.2
"""


pytestmark = pytest.mark.usefixtures("one_checkpoint_read_at_a_time")  # two replicas in one process (conftest)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("leader-checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir))


def _replica(stack: contextlib.ExitStack, config, name: str, model_dir, port: int) -> TestClient:
    app = build_app(config.with_section("server", replica_id=name), Path(model_dir))
    client = stack.enter_context(TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False))
    client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    return client


def _chat(client: TestClient, user: str) -> int:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about cats."}], "max_tokens": 2, "user": user}
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {USER_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()["policy_version"]


def _publish(store: Store, parent: int, checkpoint: Path) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


def _flattery_rewarded(store: Store, tokenizer, live: int, candidate: int, tag: str) -> None:
    """The live version: a quarter of its replies flatter (reward 0.4); the candidate: four fifths (0.83)."""
    rate_replies(store, tokenizer, live, [(FLATTERING, 1)] * 15 + [(PLAIN, 1)] * 9 + [(PLAIN, 0)] * 36, f"{tag}-live")
    rate_replies(store, tokenizer, candidate, [(FLATTERING, 1)] * 48 + [(PLAIN, 1)] * 2 + [(PLAIN, 0)] * 10, f"{tag}-cand")


def _evaluations(store: Store, version: int) -> int:
    with store.db.session() as s:
        return s.scalar(select(func.count()).select_from(Evaluation).where(Evaluation.version == version))


def _hacking_events(store: Store) -> list[tuple[int, str]]:
    return sorted((e.version, e.detail["trait"]) for e in store.operator.events(limit=10000) if e.kind == "reward_hacking")


def _holder(store: Store) -> str | None:
    lease = store.fleet.leases.get(LEADER)
    return None if lease is None or lease.expires_in <= 0 else lease.holder


def test_one_replica_decides_every_replica_routes(store_url, tmp_path, model_dir, checkpoints, tokenizer):
    port = free_port()
    path, _ = write_config(tmp_path, Path(model_dir).resolve(), "hf", port, store_url=store_url, extra=fleet_toml(tmp_path),
                           server_extra=FLEET_SERVER)
    config = load_config(path)
    store = Store(StoreConfig(url=store_url))
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        first = stack.enter_context(contextlib.ExitStack())
        r1 = _replica(first, config, "r1", model_dir, port)  # starts first: leads at once
        r2 = _replica(stack, config, "r2", model_dir, port)
        holder = _holder(store)
        assert holder is not None and holder.startswith("r1/")
        assert r1.app.state.server.leadership.leading() and not r2.app.state.server.leadership.leading()
        assert "liveloop_server_leader 1.0" in r1.get("/metrics").text and "liveloop_server_leader 0.0" in r2.get("/metrics").text

        # a learner's version: the leader makes it the candidate; both replicas route the canary users to it
        v1 = _publish(store, 0, checkpoints[0])
        wait_until(lambda: store.versions.get_version(v1).status == S.CANARY, 30, "v1 the candidate")
        wait_until(lambda: all(_chat(c, CANARY[0]) == v1 for c in (r1, r2)), 60, "both replicas serving the candidate to canary users")
        for client in (r1, r2):
            assert {_chat(client, u) for u in CANARY} == {v1}
            assert {_chat(client, u) for u in OTHERS[:8]} == {0}
        wait_until(lambda: store.release.evaluation(v1) is not None, 60, "v1 evaluated")

        # ratings that reward flattery: the alarms fire once per trait; the leader promotes; the other follows
        _flattery_rewarded(store, tokenizer, 0, v1, "a")
        wait_until(lambda: store.versions.get_version(v1).status == S.SERVING, 30, "v1 promoted")
        wait_until(lambda: {_chat(c, u) for c in (r1, r2) for u in OTHERS[:4]} == {v1}, 30, "both replicas serving v1 to everyone")
        wait_until(lambda: len(_hacking_events(store)) >= 2, 30, "the reward-hacking alarms")
        threading.Event().wait(1.5)  # several more passes of both replicas' gate and alarm loops
        assert _evaluations(store, v1) == 1
        assert _hacking_events(store) == [(v1, "emoji"), (v1, "flattery")]

        # the leader stops (its shutdown releases the lease): r2 leads at its next try and decides alone
        first.close()
        wait_until(lambda: (_holder(store) or "").startswith("r2/"), 10, "r2 leading")
        assert r2.app.state.server.leadership.leading()
        v2 = _publish(store, v1, checkpoints[1])
        wait_until(lambda: store.versions.get_version(v2).status == S.CANARY and store.release.evaluation(v2) is not None, 60, "r2 tries and evaluates v2")
        assert _chat(r2, CANARY[0]) == v2 and _evaluations(store, v2) == 1


@pytest.mark.slow
def test_a_killed_leader_process_is_replaced(tmp_path, model_dir, checkpoints, tokenizer):
    """SQLite (the lease itself is tested on both backends in tests/integration/test_store_lease.py)."""
    work = tmp_path / "leader"
    extra = fleet_toml(tmp_path)
    server = devtools.start_server(work, model_dir, "hf", extra=extra, server_extra=FLEET_SERVER, timeout=120)
    store = Store(StoreConfig(url=server.store_url))
    try:
        wait_until(lambda: _holder(store) is not None, 20, "the server process leading")
        leader = _holder(store)
        # `[server] replica_id` auto: a random name per process; the registry row ties it to this host and pid
        # (the lease is taken before the first heartbeat writes the row)
        def own_rows() -> list[str]:
            return [r.replica_id for r in store.fleet.registry.rows(60.0) if (r.host, r.pid) == (socket.gethostname(), server.proc.pid)]

        wait_until(lambda: own_rows(), 20, "the server's registry row")
        own = own_rows()
        assert len(own) == 1 and own[0].startswith("replica-") and leader.startswith(f"{own[0]}/")
        port = free_port()
        path, _ = write_config(tmp_path, Path(model_dir).resolve(), "hf", port, store_url=server.store_url, extra=extra,
                               server_extra=FLEET_SERVER)
        with contextlib.ExitStack() as stack:
            follower = _replica(stack, load_config(path), "follower", model_dir, port)
            assert _holder(store) == leader and not follower.app.state.server.leadership.leading()
            v1 = _publish(store, 0, checkpoints[0])
            wait_until(lambda: store.versions.get_version(v1).status == S.CANARY, 30, "the leader trying v1")
            wait_until(lambda: store.release.evaluation(v1) is not None, 60, "the leader evaluating v1")
            wait_until(lambda: _chat(follower, CANARY[0]) == v1, 60, "the follower routing to the candidate")

            os.killpg(server.proc.pid, signal.SIGKILL)  # the leader dies mid-canary, holding the lease
            server.proc.wait(10)
            wait_until(lambda: (_holder(store) or "").startswith("follower/"), 4 * LEASE_SECONDS, "the follower taking over")
            _flattery_rewarded(store, tokenizer, 0, v1, "b")
            wait_until(lambda: store.versions.get_version(v1).status == S.SERVING, 30, "the new leader promoting v1")
            assert _chat(follower, OTHERS[0]) == v1
            wait_until(lambda: len(_hacking_events(store)) >= 2, 30, "the new leader's alarms")
            assert _evaluations(store, v1) == 1  # the dead leader's evaluation counts: not run again
            assert _hacking_events(store) == [(v1, "emoji"), (v1, "flattery")]
    finally:
        store.close()
        server.stop()
