"""One key cannot steer the model for everyone: an in-process `OnlineLearner` (sliding-window method,
B = 8, the shipped learning rule of configs/serve/default.toml: step-size control, trust region, exact KL
anchor) on a real SQLite store, honest simulated users on 64 keys who rate up exactly the target reply,
and one attacker key that rates its own replies inverted, 5% of all ratings in the first half, 50% in
the second (the harness is bench/poisoning.py; the bench runs it bigger).

Where a run ends up is the target's probability averaged over its last quarter of steps (`p_end`);
what honest feedback taught is the no-attack run's p_end minus where it started. Measured on three
builds of the model (`[model] seed` 0, 1, 2) and, on build 0, both CPU kernel paths
(scripts/learning_matrix.sh), three harness seeds each, as means per build (per-seed range):
  taught                      +0.72, +0.73 (no vector kernels), +0.76, +0.25   (+0.18 to +0.82)
  undefended attack's shift   -0.71, -0.71, -0.75, -0.19   (0.75-0.99 of what was taught)
  defended attack's shift     -0.036, -0.062, -0.001, +0.011   (-0.086 to +0.017 per seed)
Build 2 learns slower (its MoE routing switches make the trust region cut most updates back), so the
claims are relative to what each build taught: an attack can take back no more. Runs are chaotic (six
capped attacker ratings change the end state by up to 0.09), so the assertions are on means over
seeds 0, 1, 2 with margins of about twice the measured spread. Honest users' reward under the defended
attack is the defended shift (x100 points).

Before the fix the harness learned with the bare LearnerConfig (a fixed learning rate of 2e-4, no
anchor): updates moved the policy by up to 0.5 nats, the target overshot away and, never sampled
again, got exactly zero advantage from an all-zero window, so runs ended at 1 or at 1e-5 depending on
the machine's model build; and with the shipped rule, build 2 froze after three steps because the
trust region undid every update across an MoE routing switch (docs/design.md, "Reproducible
verdicts")."""

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
    runs = [bench.compare(root / f"seed{seed}", model_dir, seed=seed) for seed in SEEDS]
    for seed, c in zip(SEEDS, runs):  # the statistics the assertions read, for the log of every build
        print(f"seed {seed}: before {c.no_attack.p_before:.3f} taught {c.taught:+.3f} undefended {c.undefended_shift:+.3f} "
              f"defended {c.defended_shift:+.3f} honest gap {c.honest_reward_gap_points:+.1f} points")
    return bench, runs


@pytest.mark.learning
def test_the_defences_touch_nothing_without_an_attack(comparisons):
    bench, runs = comparisons
    for c in runs:
        assert c.no_attack.scenario.defended  # the defended config, so it is both runs' baseline
        assert c.no_attack.capped == 0 and c.no_attack.quarantined == []
        assert c.no_attack.trained == c.no_attack.honest_ratings  # 384 = 48 full batches
        assert c.taught > 0.1, (c.no_attack.p_before, c.no_attack.p_end)  # measured +0.18 to +0.83


@pytest.mark.learning
def test_the_attack_works_undefended_and_is_capped_and_quarantined_defended(comparisons):
    bench, runs = comparisons
    for c in runs:
        u, d = c.undefended, c.defended
        total = u.honest_ratings + u.attacker_ratings  # all trained but a last partial batch
        assert total - u.scenario.batch_size < u.trained <= total and u.capped == 0 and u.quarantined == []
        assert d.capped > 0 and d.trained <= d.honest_ratings + d.scenario.ratings_per_key
        # no honest key is ever quarantined; the attacker is, where its ratings still have a consensus
        assert set(d.quarantined) <= {bench.ATTACKER}
    # the attack takes back most of what honest users taught (it can move no more than that)
    taught = sum(c.taught for c in runs) / len(runs)
    undefended = sum(c.undefended_shift for c in runs) / len(runs)
    assert undefended < -0.5 * taught, [(round(c.taught, 3), round(c.undefended_shift, 3)) for c in runs]
    assert any(bench.ATTACKER in c.defended.quarantined for c in runs)


@pytest.mark.learning
def test_defended_movement_is_small_against_undefended_and_honest_reward_holds(comparisons):
    bench, runs = comparisons
    undefended = sum(c.undefended_shift for c in runs) / len(runs)
    defended = sum(c.defended_shift for c in runs) / len(runs)
    gap = sum(c.honest_reward_gap_points for c in runs) / len(runs)
    report = [(round(c.undefended_shift, 3), round(c.defended_shift, 3), round(c.honest_reward_gap_points, 2)) for c in runs]
    taught = sum(c.taught for c in runs) / len(runs)
    assert abs(defended) <= 0.2 * abs(undefended), report  # measured 0.001-0.09 of it
    # honest users keep what they taught: their reward falls by at most 15% of it (measured at most 8.6%)
    assert gap >= -15.0 * taught, (report, round(taught, 3))


# -- the caps in the learner's batch selection, on a real store ------------------------------------
@pytest.fixture
def store(tmp_path):
    from liveloop.store import Store, StoreConfig

    s = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'caps.db'}"))
    s.migrate()
    s.versions.ensure_base_version("/models/base")
    yield s
    s.close()


def _rate(store, rid: str, key: str) -> int:
    from liveloop.store import FeedbackRecord, ResponseRecord

    store.feedback.write_batch([ResponseRecord(rid, key, "m", 0, "chat", (1, 2), (3,), (-1.0,), "stop", 1.0, 1.0, 1.0)])
    return store.feedback.put_feedback(FeedbackRecord(rid, key, 1)).id


def test_window_capped_ratings_are_passed_once_and_counted_once(store):
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.methods import make_method

    from liveloop.learner.episodes import EpisodeSamples

    sao = make_method(LearnerConfig(max_per_key_per_window=2))
    ids = [_rate(store, f"a{i}", "a") for i in range(4)]
    ratings = EpisodeSamples(store.feedback, store.episodes, 0)
    first, last = sao.next_batch(ratings, 0)
    assert [s.api_key_id for s in first] == ["a"] and last == ids[0]
    assert sao.next_batch(ratings, last)[1] == ids[1]
    assert sao.next_batch(ratings, ids[1]) is None  # a3, a4 are over a's window cap: nothing to train
    assert sao.next_batch(ratings, ids[1]) is None  # ... and the next poll starts after them
    assert sao.stats()["learner/capped_ratings"] == 2.0
    b = _rate(store, "b0", "b")
    samples, last = sao.next_batch(ratings, ids[1])
    assert [s.api_key_id for s in samples] == ["b"] and last == b  # the cursor moves past a3, a4
    assert sao.stats()["learner/capped_ratings"] == 2.0


def test_one_sample_of_a_key_per_step_and_quarantined_keys_are_never_read(store):
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.methods import make_method

    sw = make_method(LearnerConfig(method="sliding_window", batch_size=2, max_per_key_per_batch=1, max_per_key_per_window=0))
    ids = [_rate(store, rid, key) for rid, key in (("1", "a"), ("2", "a"), ("3", "q"), ("4", "b"))]
    store.keys.set_quarantined("q", True, "test")
    from liveloop.learner.episodes import EpisodeSamples

    ratings = EpisodeSamples(store.feedback, store.episodes, 0)
    samples, last = sw.next_batch(ratings, 0)
    assert [s.api_key_id for s in samples] == ["a"] and last == ids[0]  # a's second opens the next step
    samples, last = sw.next_batch(ratings, last)
    assert [s.api_key_id for s in samples] == ["a", "b"] and last == ids[3]  # q's is never read
    assert sw.stats()["learner/capped_ratings"] == 0.0  # deferred, not dropped
