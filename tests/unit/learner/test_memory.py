"""learner/memory.py: which failures are allocation failures, and the retreat's steps by hand."""

from __future__ import annotations

import torch

from liveloop.learner.memory import MemoryRetreat, out_of_memory


def test_allocation_failures_are_told_from_other_faults():
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 1642496 bytes. Error code 12 (Cannot allocate memory)")
    assert out_of_memory(cpu) and out_of_memory(MemoryError()) and out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("out of memory"))


def test_a_batch_retreats_to_one_rating_then_grows_again():
    r = MemoryRetreat()
    assert r.failed(4, last_id=8) == "retry" and r.batch_limit == 1
    r.stepped(5)
    r.stepped(6)
    assert r.batch_limit == 1  # still inside the batch that failed
    r.stepped(8)
    assert r.batch_limit is None and r.stats() == {"learner/out_of_memory_steps": 1.0}


def test_a_lone_rating_is_retried_once_then_passed_when_it_comes_up():
    r = MemoryRetreat()
    assert r.stats() == {}  # no failure yet: no figure (the metrics of a learner without the guard)
    assert r.failed(4, last_id=8) == "retry"
    r.stepped(6)
    assert r.failed(1, last_id=7) == "retry"  # alone, once: maybe the engine's peak beside it
    assert not r.passes(6)
    r.stepped(6)  # an earlier rating trained again after a reload: the one failure is remembered
    assert r.failed(1, last_id=7) == "pass" and r.batch_limit == 1
    assert r.passes(7) and not r.passes(7)  # passed once
    r.stepped(7)
    r.stepped(8)
    assert r.batch_limit is None and r.failures == 3


def test_a_lone_rating_that_fits_the_second_time_trains():
    r = MemoryRetreat()
    assert r.failed(1, last_id=3) == "retry"
    r.stepped(3)
    assert r.failed_alone is None and r.batch_limit is None and r.to_pass is None


def test_a_group_the_method_cannot_split_is_passed_on_its_second_failure():
    r = MemoryRetreat()
    assert r.failed(2, last_id=6) == "retry"  # a GRPO group of two
    assert r.failed(2, last_id=6) == "pass" and r.passes(6)  # offered whole again: passed whole
