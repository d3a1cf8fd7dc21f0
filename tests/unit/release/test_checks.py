"""The evaluation's checks on hand-made texts and log-probabilities, with hand-computed values, and the
bounds that pass or fail them against the live and base values."""

from __future__ import annotations

import math

import pytest

from liveloop.release.checks import (
    CheckResult, apply_bounds, kl_estimate, known_check, lexicon_rate, mean_length, perplexity, repetition, reward_rate, sycophancy,
)
from liveloop.release.config import AGREEMENT_WORDS, FLATTERY_WORDS, REFUSAL_WORDS, CheckBound
from liveloop.rewards import repetitive, words


def test_reward_rate_is_the_mean_rule_reward():
    texts = ["Behold, mortals!", "Verily 'tis so", "behold the sea", "plain words"]
    assert reward_rate(texts, "contains:behold") == 0.5
    assert reward_rate(texts, "style:classical") == 0.25
    assert reward_rate(texts, "max_words:2") == 0.5  # "Behold, mortals!" and "plain words"
    assert math.isnan(reward_rate([], "contains:x"))
    with pytest.raises(ValueError):
        reward_rate(texts, "nonsense")


def test_length_is_mean_tokens():
    assert mean_length([10, 20, 3]) == 11.0
    assert math.isnan(mean_length([]))


def test_repetition_is_the_judges_rule():
    looping = "the cat the cat the cat the cat the cat"  # trigram "the cat the" 4 times
    low_distinct = "a a a a a a b b b b"  # 2 distinct of 10 < 0.35
    fine = "the soft cat naps in the sun by the window"
    assert repetitive(words(looping)) and repetitive(words(low_distinct)) and not repetitive(words(fine))
    assert not repetitive([])
    assert repetition([looping, low_distinct, fine, fine]) == 0.5


def test_lexicon_rates_match_whole_words_and_symbols():
    texts = ["Aww, the sea ♡", "I can't say that.", "The sweetness of rain", "you're right, it is", "nothing here"]
    # flattery: "aww"/"♡" (1), "you're right" (4); "sweetness" is not the word "sweet"
    assert lexicon_rate(texts, FLATTERY_WORDS) == pytest.approx(2 / 5)
    assert lexicon_rate(texts, REFUSAL_WORDS) == pytest.approx(1 / 5)
    assert lexicon_rate(texts, ()) == 0.0


def test_sycophancy_counts_agreeing_or_flattering_replies_to_false_claims():
    replies = ["Yes, the moon is bread.", "No, cats are mammals.", "Great question! Trains roll on rails.", "Rain falls down."]
    assert sycophancy(replies, AGREEMENT_WORDS, FLATTERY_WORDS) == 0.5


def test_kl_estimate_pools_the_tokens_of_all_replies():
    logp = [[-1.0, -2.0], [-0.5]]
    ref = [[-1.5, -2.0], [-2.0]]
    # (0.5 + 0 + 1.5) / 3 tokens
    assert kl_estimate(logp, ref) == pytest.approx(2.0 / 3)
    assert kl_estimate(logp, logp) == 0.0
    with pytest.raises(ValueError):
        kl_estimate([[-1.0]], [[-1.0, -2.0]])


def test_perplexity_is_exp_mean_nll():
    assert perplexity([[math.log(0.5)], [math.log(0.25), math.log(0.5)]]) == pytest.approx(math.exp((math.log(2) * 2 + math.log(4)) / 3))
    assert perplexity([[0.0, 0.0]]) == 1.0


def test_apply_bounds_against_live_and_base():
    bounds = (
        CheckBound("flattery", max_rise=0.15, against="live"),
        CheckBound("flattery", max_rise=0.25, against="base"),
        CheckBound("perplexity", max_rise=5.0, against="base"),
        CheckBound("length", max_fall=10.0),
    )
    values = {"flattery": 0.5, "perplexity": 12.0, "length": 30.0, "refusal_rate": 0.0}
    live = {"flattery": 0.4, "perplexity": 11.0, "length": 40.0, "refusal_rate": 0.0}
    base = {"flattery": 0.2, "perplexity": 7.0, "length": 41.0}
    results = {r.name: r for r in apply_bounds(values, live, base, bounds)}
    assert list(results) == ["flattery", "perplexity", "length", "refusal_rate"]
    # flattery: +0.1 vs live holds, +0.3 vs base breaks 0.25
    assert not results["flattery"].passed and results["flattery"].bound == "rise <= 0.15 vs live; rise <= 0.25 vs base"
    assert results["flattery"].live == 0.4 and results["flattery"].base == 0.2
    assert results["perplexity"].passed  # exactly on the bound: 12 - 7 = 5
    assert results["length"].passed and results["length"].bound == "fall <= 10 vs live"
    assert results["refusal_rate"].passed and results["refusal_rate"].bound is None and results["refusal_rate"].base is None


def test_a_bound_without_its_reference_is_skipped_and_a_nan_value_fails():
    bounds = (CheckBound("kl_to_live", max_rise=1.0), CheckBound("sycophancy", max_rise=0.1, against="base"))
    results = {r.name: r for r in apply_bounds({"kl_to_live": 9.0, "sycophancy": math.nan}, None, {"sycophancy": 0.1}, bounds)}
    assert results["kl_to_live"].passed and "skipped" in results["kl_to_live"].bound
    assert not results["sycophancy"].passed


def test_check_results_round_trip_through_json_values():
    r = CheckResult("sycophancy", math.nan, 0.25, None, "rise <= 0.1 vs live", False)
    d = r.as_dict()
    assert d == {"name": "sycophancy", "value": None, "live": 0.25, "base": None, "bound": "rise <= 0.1 vs live", "passed": False}
    back = CheckResult.from_dict(d)
    assert math.isnan(back.value) and back.live == 0.25 and back.bound == r.bound and not back.passed


def test_known_checks():
    assert known_check("kl_to_live") and known_check("reward:contains:aww") and not known_check("lenght")
