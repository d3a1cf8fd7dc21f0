"""The store's leases (store/lease.py) on real SQLite and PostgreSQL: one holder at a time; the holder
renews (its term kept), another caller is refused until the lease expires on the database's clock,
then takes it over (the term grows); a released lease is taken at once; two stores (two processes'
connections) racing for a fresh lease from many threads end with exactly one holder."""

from __future__ import annotations

import threading
import time

import pytest

from liveloop.store import Store, StoreConfig
from liveloop.store.lease import LEADER


def test_one_holder_renewal_expiry_takeover_release(store):
    leases = store.fleet.leases
    assert leases.get(LEADER) is None
    a = leases.acquire(LEADER, "a", 1.5)
    assert (a.holder, a.term, a.held) == ("a", 1, True) and 0 < a.expires_in <= 1.5
    b = leases.acquire(LEADER, "b", 1.5)  # held by a: refused, and b learns who holds it
    assert (b.holder, b.term, b.held) == ("a", 1, False)
    renewed = leases.acquire(LEADER, "a", 1.5)
    assert (renewed.holder, renewed.term, renewed.held) == ("a", 1, True)
    assert leases.get(LEADER, "a").held and not leases.get(LEADER, "b").held

    time.sleep(1.7)  # a stops renewing (killed): expired on the database's clock
    gone = leases.get(LEADER, "a")
    assert gone.holder == "a" and not gone.held and gone.expires_in <= 0
    taken = leases.acquire(LEADER, "b", 30)
    assert (taken.holder, taken.term, taken.held) == ("b", 2, True)
    late = leases.acquire(LEADER, "a", 30)  # the old holder comes back: not its lease any more
    assert (late.holder, late.term, late.held) == ("b", 2, False)

    assert not leases.release(LEADER, "a")  # only the holder releases
    assert leases.release(LEADER, "b")
    released = leases.get(LEADER)
    assert released.holder is None and not released.held
    again = leases.acquire(LEADER, "a", 30)  # at once, no expiry to wait for
    assert (again.holder, again.term, again.held) == ("a", 3, True)
    assert leases.acquire("other-duty", "b", 30).held  # leases are independent by name
    with pytest.raises(ValueError):
        leases.acquire(LEADER, "a", 0)


def test_racing_callers_on_two_stores_leave_one_holder(store, store_url):
    other = Store(StoreConfig(url=store_url))
    try:
        stores = [store.fleet.leases, other.fleet.leases]
        won: list[str] = []
        start = threading.Barrier(8)

        def contend(i: int) -> None:
            start.wait()
            for _ in range(5):
                state = stores[i % 2].acquire(LEADER, f"holder-{i}", 30)
                if state.held:
                    won.append(state.holder)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(set(won)) == 1 and len(won) == 5  # one holder, renewing; nobody else ever held it
        final = stores[1].get(LEADER, won[0])
        assert final.held and final.term == 1
    finally:
        other.close()
