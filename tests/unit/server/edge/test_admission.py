"""server/edge/admission.py: a request's n generation slots are taken all or none, per key and in total
(its choices start together or not at all: nothing half-started, nothing half-logged)."""

from __future__ import annotations

import pytest

from liveloop.server.edge.admission import Admission, Busy
from liveloop.server.config import ServerConfig


def test_slots_are_taken_all_or_none():
    admission = Admission(ServerConfig(max_concurrent_per_key=3, max_concurrent_total=4))
    with admission.generation("a", 2):
        with pytest.raises(Busy):
            admission.generation("a", 2).__enter__()  # 2 + 2 > 3 for this key
        assert (admission.total, admission._running["a"]) == (2, 2)  # the refused request holds nothing
        with admission.generation("b", 2):
            with pytest.raises(Busy):
                admission.generation("c", 1).__enter__()  # 4 running: the server's limit
            assert admission.total == 4
        with admission.generation("a", 1):
            assert admission.total == 3
    assert admission.total == 0 and not admission._running
