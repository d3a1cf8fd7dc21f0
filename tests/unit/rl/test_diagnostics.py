"""Entropy, token KL and explained variance with hand-computed values; log-distributions at the
response positions agree with the per-token logprobs the losses use."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from liveloop.rl.batch import Sample, make_batch, response_log_dists, response_logprobs
from liveloop.rl.diagnostics import explained_variance, token_entropy, token_kl


def test_entropy_of_uniform_and_certain_distributions():
    logp = torch.log(torch.tensor([[[0.25] * 4, [1.0, 1e-30, 1e-30, 1e-30]]]))
    mask = torch.tensor([[1, 0]])
    assert token_entropy(logp, mask) == pytest.approx(math.log(4))
    assert token_entropy(logp, torch.tensor([[1, 1]])) == pytest.approx(math.log(4) / 2, abs=1e-6)


def test_token_kl_by_hand():
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.9, 0.1]]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert token_kl(p, q, torch.ones(1, 1)) == pytest.approx(expected)
    assert token_kl(p, p, torch.ones(1, 1)) == 0.0


def test_explained_variance():
    r = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert explained_variance(r, r) == 1.0
    assert explained_variance(torch.full((4,), 0.5), r) == pytest.approx(0.0)
    assert explained_variance(1 - r, r) == pytest.approx(-3.0)  # error var 1 against var 0.25
    assert explained_variance(torch.zeros(3), torch.ones(3)) == 0.0  # nothing to explain


def test_log_dists_agree_with_logprobs_on_a_ragged_batch():
    torch.manual_seed(0)
    samples = [
        Sample(np.array([1, 2, 3]), np.array([4, 5]), np.zeros(2, np.float32), np.ones(2, np.uint8), 1.0, 0),
        Sample(np.array([1]), np.array([6, 7, 8, 9]), np.zeros(4, np.float32), np.ones(4, np.uint8), 0.0, 0),
    ]
    batch = make_batch(samples)
    logits = torch.randn(2, batch.input_ids.shape[1], 11)
    dists = response_log_dists(logits, batch)
    assert dists.shape == (2, batch.width, 11)
    lp = response_logprobs(logits, batch)
    for b, (p, s) in enumerate(zip(batch.prompt_lengths, samples)):
        for t, tok in enumerate(s.response_ids):
            assert float(lp[b, t]) == pytest.approx(float(torch.log_softmax(logits[b, p - 1 + t], -1)[tok]), abs=1e-6)
