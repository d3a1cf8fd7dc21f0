"""One key cannot steer the model for everyone: an in-process `OnlineLearner` (sliding-window method,
B = 8) on a real SQLite store, honest simulated users on 64 keys who rate up exactly the target reply,
and one attacker key that rates its own replies inverted, 5% of all ratings in the first half, 50% in
the second (the harness is bench/poisoning.py; the bench runs it bigger).

Measured (seeds 0-4 at this size): the undefended
attack pulls the target's probability down by 4-92 points; with the influence caps and quarantine by
disagreement score the attack-caused movement is 0.1-4% of that in four seeds and 89% in one (seed 1,
where the undefended attack itself moved it only 4.5 points); honest users' reward is within 4 points
of the no-attack run in every seed. A single seed is therefore not a claim; the assertions are on the
mean over seeds 0, 1, 2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SEEDS = (0, 1, 2)


def _harness():
    spec = importlib.util.spec_from_file_location("bench_poisoning", ROOT / "bench" / "poisoning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory, model_dir):
    bench = _harness()
    root = tmp_path_factory.mktemp("poisoning")
    return bench, [bench.compare(root / f"seed{seed}", model_dir, seed=seed) for seed in SEEDS]


def test_the_defences_touch_nothing_without_an_attack(comparisons):
    bench, runs = comparisons
    for c in runs:
        assert c.no_attack.scenario.defended  # the defended config, so it is both runs' baseline
        assert c.no_attack.capped == 0 and c.no_attack.quarantined == []
        assert c.no_attack.trained == c.no_attack.honest_ratings  # 384 = 48 full batches
        assert c.no_attack.p_after > c.no_attack.p_before + 0.3  # honest feedback teaches the target


def test_the_attack_works_undefended_and_is_capped_and_quarantined_defended(comparisons):
    bench, runs = comparisons
    for c in runs:
        u, d = c.undefended, c.defended
        total = u.honest_ratings + u.attacker_ratings  # all trained but a last partial batch
        assert total - u.scenario.batch_size < u.trained <= total and u.capped == 0 and u.quarantined == []
        assert d.capped > 0 and d.trained <= d.honest_ratings + d.scenario.ratings_per_key
        # no honest key is ever quarantined; the attacker is, where its ratings still have a consensus
        assert set(d.quarantined) <= {bench.ATTACKER}
    assert sum(c.undefended_shift for c in runs) / len(runs) < -0.2
    assert any(bench.ATTACKER in c.defended.quarantined for c in runs)


def test_defended_movement_is_a_tenth_of_undefended_and_honest_reward_holds(comparisons):
    bench, runs = comparisons
    undefended = sum(c.undefended_shift for c in runs) / len(runs)
    defended = sum(c.defended_shift for c in runs) / len(runs)
    gap = sum(c.honest_reward_gap_points for c in runs) / len(runs)
    report = [(round(c.undefended_shift, 3), round(c.defended_shift, 3), round(c.honest_reward_gap_points, 2)) for c in runs]
    assert abs(defended) <= 0.1 * abs(undefended), report
    assert abs(gap) <= 2.0, report


# -- the caps in the learner's batch selection, on a real store ------------------------------------
@pytest.fixture
def store(tmp_path):
    from liveloop.store import Store, StoreConfig

    s = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'caps.db'}"))
    s.migrate()
    s.ensure_base_version("/models/base")
    yield s
    s.close()


def _rate(store, rid: str, key: str) -> int:
    from liveloop.store import FeedbackRecord, ResponseRecord

    store.write_batch([ResponseRecord(rid, key, "m", 0, "chat", (1, 2), (3,), (-1.0,), "stop", 1.0, 1.0, 1.0)])
    return store.put_feedback(FeedbackRecord(rid, key, 1)).id


def test_window_capped_ratings_are_passed_once_and_counted_once(store):
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.methods import make_method

    sao = make_method(LearnerConfig(max_per_key_per_window=2))
    ids = [_rate(store, f"a{i}", "a") for i in range(4)]
    first, last = sao.next_batch(store, 0)
    assert [s.api_key_id for s in first] == ["a"] and last == ids[0]
    assert sao.next_batch(store, last)[1] == ids[1]
    assert sao.next_batch(store, ids[1]) is None  # a3, a4 are over a's window cap: nothing to train
    assert sao.next_batch(store, ids[1]) is None  # ... and the next poll starts after them
    assert sao.stats()["learner/capped_ratings"] == 2.0
    b = _rate(store, "b0", "b")
    samples, last = sao.next_batch(store, ids[1])
    assert [s.api_key_id for s in samples] == ["b"] and last == b  # the cursor moves past a3, a4
    assert sao.stats()["learner/capped_ratings"] == 2.0


def test_one_sample_of_a_key_per_step_and_quarantined_keys_are_never_read(store):
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.methods import make_method

    sw = make_method(LearnerConfig(method="sliding_window", batch_size=2, max_per_key_per_batch=1, max_per_key_per_window=0))
    ids = [_rate(store, rid, key) for rid, key in (("1", "a"), ("2", "a"), ("3", "q"), ("4", "b"))]
    store.set_quarantined("q", True, "test")
    samples, last = sw.next_batch(store, 0)
    assert [s.api_key_id for s in samples] == ["a"] and last == ids[0]  # a's second opens the next step
    samples, last = sw.next_batch(store, last)
    assert [s.api_key_id for s in samples] == ["a", "b"] and last == ids[3]  # q's is never read
    assert sw.stats()["learner/capped_ratings"] == 0.0  # deferred, not dropped
