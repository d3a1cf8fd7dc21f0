"""The server's automatic quarantine over a real store: honest keys that agree on the same replies are
left alone; a key that inverts their consensus is quarantined once, with an operator event, and its
ratings leave the training stream (kept in the store)."""

from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.server.control.operations import Operations
from liveloop.server.control.activator import Activator
from liveloop.store import FeedbackRecord, ResponseRecord, Store

HONEST = [f"honest{i:010d}"[:16] for i in range(5)]
ATTACKER = "attacker00000000"


def _traffic(store: Store, groups: int) -> None:
    recs, ratings = [], []
    for g in range(groups):
        liked = g % 2 == 0  # every honest key likes the even replies
        for key in HONEST + [ATTACKER]:
            rid = f"r{g}-{key}"
            recs.append(ResponseRecord(rid, key, "m", 0, "chat", (1, g), (7, g % 5), (-1.0, -1.0), "stop", 1.0, 1.0, 1.0))
            reward = int(liked) if key != ATTACKER else int(not liked)
            if key == HONEST[0] and g % 7 == 0:
                reward = 1 - reward  # an honest key is not perfectly consistent
            ratings.append(FeedbackRecord(rid, key, reward))
    store.feedback.write_batch(recs)
    store.feedback.write_batch(ratings)


def _operations(config: MonitorConfig, store: Store) -> Operations:
    activator = Activator(None, store.versions, store.operator, Metrics())
    return Operations(
        config, activator, Metrics(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
    )


def test_auto_quarantine_takes_the_inverting_key_only(store):
    ops = _operations(MonitorConfig(quarantine_z=4.0, quarantine_min_ratings=30, quarantine_corroborating_keys=3), store)
    _traffic(store, 60)
    assert ops.quarantine_suspects() == [ATTACKER]
    assert ops.quarantine_suspects() == []  # once
    states = {k.key_id: k for k in store.keys.key_states()}
    assert states[ATTACKER].quarantined and "automatic" in states[ATTACKER].reason
    assert not any(states[k].quarantined for k in HONEST)
    assert [e.kind for e in store.operator.events()].count("quarantine") == 1
    trained_keys = {f.api_key_id for f, _ in store.feedback.rated_after(0, 10_000)}
    assert ATTACKER not in trained_keys and set(HONEST) <= trained_keys
    assert len(store.feedback.get_feedback(f"r0-{ATTACKER}")) == 1  # kept


def test_off_by_default(store):
    ops = _operations(MonitorConfig(), store)
    _traffic(store, 60)
    assert ops.quarantine_suspects() == []
