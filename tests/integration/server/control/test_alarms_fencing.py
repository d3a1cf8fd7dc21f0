"""The reward-hacking alarms' hold (server/control/alarms.py, `auto_hold`) as a deposed leader, on real SQLite
and PostgreSQL with the real hf engine and leases: a replica that judged a flattering candidate in a
term another holder has since taken over is refused (StaleLeader) before it holds the candidate,
pauses its lineage's learning or records an alarm; judging in the current term, it does all three."""

from __future__ import annotations

import time

import pytest

from liveloop.store import VersionStatus
from liveloop.store.lease import LEADER, Leases, StaleLeader

from ..conftest import rate_replies
from .test_alarms import _operations, _population, _publish, tokenizer  # noqa: F401 (a fixture)

LEASE = 0.6


async def test_a_deposed_leaders_alarm_holds_and_records_nothing(store, engine, tokenizer):  # noqa: F811
    leases = store.fleet.leases
    old = leases.acquire(LEADER, "r1/old", LEASE).term
    rate_replies(store, tokenizer, 0, _population(15, 45, 9), "live")
    candidate = _publish(store, 0)
    store.versions.start_canary(candidate)
    rate_replies(store, tokenizer, candidate, _population(48, 12, 2), "cand")
    ops = _operations(store, engine, tokenizer, auto_hold=True)
    time.sleep(LEASE + 0.3)  # paused past its lease: another replica leads now
    new = leases.acquire(LEADER, "r2/new", 60).term

    with pytest.raises(StaleLeader):
        ops.alarms.check(old)
    assert store.versions.get_version(candidate).status == VersionStatus.CANARY and not store.operator.learning_paused("sao")
    assert not [e for e in store.operator.events() if e.kind in ("reward_hacking", "release_held")]

    ops.alarms.reset()  # as watch_alarms does on a change of term
    [verdict] = ops.alarms.check(new)
    assert verdict.held and verdict.paused and store.versions.get_version(candidate).status == VersionStatus.HELD
    assert sorted(e.detail["trait"] for e in store.operator.events() if e.kind == "reward_hacking") == ["emoji", "flattery"]
