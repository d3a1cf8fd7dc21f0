"""rl/batch.py: a constrained sample is scored under its grammar's masks (hand-computed), and a
constrained sample whose grammar was not replayed cannot be scored at all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from liveloop.rl.batch import UNMASKED, Sample, UnmaskedConstraint, make_batch, response_log_dists, token_logprobs


class _Masks:
    """Stands for liveloop.grammar.Grammars: one fixed packed mask per response token."""

    def __init__(self, words: list[int]):
        self.words = words

    def allowed(self, grammar, response_ids):
        assert grammar == "g"
        return torch.tensor([[w] for w in self.words[: len(response_ids)]], dtype=torch.int32)


def _sample(grammar=None):
    # prompt [1], response [2, 3]: logits at prompt position 0 and response position 0 score them
    return Sample(np.array([1]), np.array([2, 3]), np.array([-0.5, -0.5], np.float32), np.ones(2, np.uint8), 1.0, 0, grammar=grammar)


def _logits():
    # vocab 4; row 0 predicts token 2, row 1 predicts token 3; logits 0, ln 2, ln 3, ln 4
    row = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    return torch.stack([row, row, row])[None]


def test_free_samples_are_scored_over_the_whole_vocabulary():
    batch = make_batch([_sample()])
    lp = token_logprobs(response_log_dists(_logits(), batch), batch)
    # p(2) = 3/10, p(3) = 4/10
    assert lp[0].tolist() == pytest.approx([math.log(0.3), math.log(0.4)], abs=1e-6)
    assert batch.allowed == ()


def test_constrained_samples_are_scored_over_what_their_grammar_allowed():
    # position 0 allowed tokens 1, 2 (0b0110): p(2) = 3 / (2 + 3); position 1 allowed only token 3: p = 1
    batch = make_batch([_sample("g"), _sample()], grammars=_Masks([0b0110, 0b1000]))
    lp = token_logprobs(response_log_dists(_logits().expand(2, -1, -1), batch), batch)
    assert lp[0].tolist() == pytest.approx([math.log(0.6), 0.0], abs=1e-6)
    assert lp[1].tolist() == pytest.approx([math.log(0.3), math.log(0.4)], abs=1e-6)  # its neighbour is untouched


def test_a_constrained_sample_without_its_grammar_is_valued_but_never_scored():
    batch = make_batch([_sample("g")])
    assert batch.allowed[0] is UNMASKED
    with pytest.raises(UnmaskedConstraint):
        response_log_dists(_logits(), batch)
