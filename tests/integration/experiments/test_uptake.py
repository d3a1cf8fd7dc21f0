"""The short version of bench/new_objectives.py: a word the users reward, taken up by the whole policy
and by a segment's adapter on the learning rig, with the other segment untouched by the adapter."""

from __future__ import annotations

import pytest

from liveloop.experiments.uptake import UptakeSpec, pretrained_critic, uptake

pytestmark = pytest.mark.learning


def test_a_rewarded_word_shows_up_and_an_adapter_keeps_it_to_its_segment(tmp_path, model_dir):
    shared = UptakeSpec("contains:behold", "shared", seed=0, max_ratings=200, pretrain_rollouts=64)
    ev = pretrained_critic(tmp_path / "critic", model_dir, shared)
    whole = uptake(tmp_path / "shared", model_dir, shared, critic_from=tmp_path / "critic", critic_ev=ev)
    assert whole.ratings_to_effect is not None, f"no effect within {whole.ratings} ratings: {whole.rewards}"
    assert whole.after >= whole.before + 0.25  # the probe (fixed prompts, fixed sampling seed) agrees
    assert whole.leak > 0  # one set of weights: night's users get the word too
    adapter = uptake(tmp_path / "adapter", model_dir, UptakeSpec("contains:behold", "adapter", seed=0, max_ratings=60,
                     pretrain_rollouts=64), critic_from=tmp_path / "critic", critic_ev=ev)
    assert adapter.leak == 0.0 and adapter.other_before == whole.other_before  # night is served the base, exactly
    assert adapter.ratings == 60 or adapter.ratings_to_effect is not None
