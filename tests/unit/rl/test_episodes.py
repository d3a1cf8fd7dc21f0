"""An episode as one sample (rl/episodes.py), by hand: where each turn's action tokens sit in the last
prompt, the observation tokens between them masked out, a rewritten stop token left out, earlier-credited
turns as context, an asserted link starting the sample, a mismatch refused; and the skip-observation GAE
on a multi-turn sample against values computed by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from liveloop.rl.advantages import gae_skip_observations
from liveloop.rl.batch import make_batch
from liveloop.rl.episodes import EpisodeMismatch, episode_sample

END, EOS = 9, 8


def turn(prompt_tokens, response, lps, version=0, prefix=None, spans=None, grammar=None):
    return SimpleNamespace(prompt_tokens=prompt_tokens, prefix_tokens=prefix, response_ids=np.array(response),
                           behavior_logprobs=np.array(lps, np.float32), version_spans=spans, policy_version=version, grammar=grammar)


# turn 1: prompt [1 2 3], sampled [5 6 END]; observation [7 7]; turn 2 sampled [11 END]
T1 = turn(3, [5, 6, END], [-1, -2, -3], version=0)
T2 = turn(8, [11, END], [-4, -5], version=1, prefix=6)
PROMPT2 = np.array([1, 2, 3, 5, 6, END, 7, 7])


def test_every_turns_tokens_are_actions_and_the_rest_observations():
    s = episode_sample([T1, T2], PROMPT2, 1.0, "k")
    assert s.prompt_ids.tolist() == [1, 2, 3]
    assert s.response_ids.tolist() == [5, 6, END, 7, 7, 11, END]
    assert s.action_mask.tolist() == [1, 1, 1, 0, 0, 1, 1]
    assert s.behavior_logprobs.tolist() == [-1, -2, -3, 0, 0, -4, -5]
    assert s.token_versions().tolist()[:3] == [0, 0, 0] and s.token_versions().tolist()[5:] == [1, 1]
    assert (s.reward, s.policy_version, s.api_key_id) == (1.0, 1, "k")


def test_a_stop_token_the_template_rewrote_is_neither_action_nor_observation():
    t1 = turn(3, [5, 6, EOS], [-1, -2, -3])
    t2 = turn(8, [11, END], [-4, -5], version=0, prefix=5)  # the prompt carries [5 6], then END (the template's)
    s = episode_sample([t1, t2], PROMPT2, 0.0)
    assert s.action_mask.tolist() == [1, 1, 0, 0, 0, 1, 1]  # END at 2 is the template's: observation
    assert s.behavior_logprobs.tolist()[:3] == [-1, -2, 0]


def test_turns_an_earlier_rating_credited_are_context():
    s = episode_sample([T1, T2], PROMPT2, 1.0, credited_through=0)
    assert s.action_mask.tolist() == [0, 0, 0, 0, 0, 1, 1]


def test_an_asserted_link_starts_the_sample_at_its_turn():
    t2 = turn(8, [11, END], [-4, -5], prefix=None)  # linked by previous_response_id or episode_id, not by tokens
    s = episode_sample([T1, t2], PROMPT2, 1.0)
    assert s.prompt_ids.tolist() == PROMPT2.tolist() and s.response_ids.tolist() == [11, END]
    assert s.action_mask.tolist() == [1, 1]


def test_tokens_not_where_the_links_say_are_refused():
    with pytest.raises(EpisodeMismatch):
        episode_sample([T1, T2], np.array([1, 2, 3, 5, 60, END, 7, 7]), 1.0)
    with pytest.raises(EpisodeMismatch):
        episode_sample([T1, T2], PROMPT2[:-1], 1.0)  # the record says 8 prompt tokens


def test_each_turns_grammar_covers_its_own_tokens():
    t1 = turn(3, [5, 6, END], [-1, -2, -3], grammar="g1")
    s = episode_sample([t1, T2], PROMPT2, 1.0)
    assert s.grammar_spans == ((0, 3, "g1"),) and s.grammar is None


def test_the_skip_observation_gae_of_a_two_turn_episode_by_hand():
    s = episode_sample([T1, T2], PROMPT2, 1.0)
    mask = make_batch([s]).action_mask[0]
    values = torch.tensor([0.5, 0.25, 0.75, 9.0, -9.0, 0.5, 0.25])  # the observations' values must not matter
    adv, ret = gae_skip_observations(values, 1.0, mask, gamma=1.0, lam=0.5)
    # action positions 0 1 2 5 6; next(2) = 5 skips the observations 3, 4
    # t6: d = 1 + 0 - 0.25 = 0.75                          A = 0.75
    # t5: d = 0 + 0.25 - 0.5 = -0.25                       A = -0.25 + 0.5 * 0.75 = 0.125
    # t2: d = 0 + 0.5 - 0.75 = -0.25                       A = -0.25 + 0.5 * 0.125 = -0.1875
    # t1: d = 0 + 0.75 - 0.25 = 0.5                        A = 0.5 + 0.5 * -0.1875 = 0.40625
    # t0: d = 0 + 0.25 - 0.5 = -0.25                       A = -0.25 + 0.5 * 0.40625 = -0.046875
    assert adv.tolist() == pytest.approx([-0.046875, 0.40625, -0.1875, 0.0, 0.0, 0.125, 0.75])
    assert ret.tolist() == pytest.approx([0.453125, 0.65625, 0.5625, 0.0, 0.0, 0.625, 1.0])


def test_the_ablation_trains_the_observations_between_turns_unscored():
    s = episode_sample([T1, T2], PROMPT2, 1.0, observations_as_actions=True)
    assert s.action_mask.tolist() == [1] * 7
    assert np.isnan(s.behavior_logprobs[3:5]).all() and s.behavior_logprobs[5] == -4
