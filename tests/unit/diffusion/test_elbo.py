"""The ELBO estimator: stratified counts, masks drawn once and only over the response, 1/p weighting
and length normalization (hand-computed), and the diffu-GRPO one-pass input."""

from __future__ import annotations

import math

import pytest
import torch

from liveloop.diffusion.elbo import (
    draw_masks,
    elbo_terms,
    masked_input,
    one_pass_logprobs,
    sample_elbo,
    stratified_counts,
)

MASK = 2


class HalvingModel:
    """p(token 5) = 1/2 at response position 0, 1/4 at 1, 1/8 at 2, ... (logits over 2 real classes +
    an impossible rest). Records inputs."""

    mask_id = MASK

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len
        self.seen = []

    def __call__(self, x):
        self.seen.append(x.clone())
        b, t = x.shape
        logits = torch.full((b, t, 8), -1e9)
        for pos in range(t):
            i = max(pos - self.prompt_len, 0) + 1
            p = 0.5 ** i
            logits[:, pos, 5] = math.log(p)
            logits[:, pos, 6] = math.log(1 - p)
        return logits


def test_stratified_counts():
    # L = 8, n_t = 4, k = 3: linspace(3, 3 + 3 * 8 / 4 = 9, 4) = [3, 5, 7, 9] -> 9 wraps to 1
    assert stratified_counts(3, 8, 4).tolist() == [3, 5, 7, 1]
    # k = 1, n_t = 1: a single sample with 1 mask
    assert stratified_counts(1, 8, 1).tolist() == [1]


def test_draw_masks_shapes_counts_and_seed():
    a = draw_masks(3, 10, 4, torch.Generator().manual_seed(0))
    b = draw_masks(3, 10, 4, torch.Generator().manual_seed(0))
    assert a.masks.shape == (3, 4, 10) and torch.equal(a.masks, b.masks)
    assert torch.equal(a.masks.sum(-1), a.counts)
    assert ((a.counts >= 1) & (a.counts <= 10)).all()
    # stratified: the 4 counts of a response are spread about L / n_t = 2.5 apart (mod L)
    for row in a.counts:
        assert len(set(row.tolist())) == 4


def test_sample_elbo_weights_by_one_over_p_and_divides_by_length():
    model = HalvingModel(prompt_len=2)
    prompt = torch.tensor([[9, 9]])
    response = torch.tensor([[5, 5, 5, 5]])
    mask = torch.tensor([[True, True, False, False]])
    l = sample_elbo(model, prompt, response, mask, torch.tensor([2]))
    # masked log-probs: log 1/2 + log 1/4 = -3 log 2; p = 2/4 -> (1/p) * (-3 log 2) / 4 = -1.5 log 2
    assert l.item() == pytest.approx(-1.5 * math.log(2), rel=1e-5)
    # the model saw the prompt untouched and exactly the masked response positions as MASK
    assert model.seen[-1].tolist() == [[9, 9, MASK, MASK, 5, 5]]
    assert masked_input(prompt, response, mask, MASK).tolist() == [[9, 9, MASK, MASK, 5, 5]]


def test_elbo_terms_reuses_the_drawn_masks():
    model = HalvingModel(prompt_len=1)
    draw = draw_masks(2, 4, 3, torch.Generator().manual_seed(1))
    prompt, response = torch.tensor([[9], [9]]), torch.full((2, 4), 5)
    t1 = elbo_terms(model, prompt, response, draw)
    t2 = elbo_terms(model, prompt, response, draw)
    assert t1.shape == (2, 3) and torch.equal(t1, t2)  # same masks -> identical terms (common random numbers)
    for x, j in zip(model.seen[:3], range(3)):
        assert torch.equal(x[:, 1:] == MASK, draw.masks[:, j])


def test_one_pass_masks_the_whole_response_and_some_prompt():
    model = HalvingModel(prompt_len=200)
    prompt = torch.full((1, 200), 9)
    lp = one_pass_logprobs(model, prompt, torch.full((1, 3), 5), 0.15, torch.Generator().manual_seed(0))
    x = model.seen[-1]
    assert (x[0, 200:] == MASK).all()
    frac = (x[0, :200] == MASK).float().mean().item()
    assert 0.07 < frac < 0.25  # about 15% of 200 prompt tokens
    assert lp.shape == (1, 3)
