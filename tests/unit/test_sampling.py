"""liveloop/sampling.py: the draw's shaping by hand on a four-token distribution, its agreement with vLLM's
own sampler functions on random logits, and which draws a learner cannot score."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from liveloop.sampling import CUT, PLAIN, Sampling, draw_logits, drawn_temperature

PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def _lp(s: Sampling, keep: list[int] | None = None) -> np.ndarray:
    logits = torch.tensor(np.log(PROBS), dtype=torch.float32)[None]
    k = None if keep is None else torch.tensor(keep)
    return torch.log_softmax(draw_logits(logits, s, k), -1)[0].double().numpy()


def _renorm(p: np.ndarray, kept: list[int]) -> np.ndarray:
    out = np.full(len(p), -np.inf)
    out[kept] = np.log(p[kept] / p[kept].sum())
    return out


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        # ascending 0.05, 0.15, 0.3, 0.5: cumulative 0.05, 0.2, 0.5, 1; dropped while <= 1 - 0.7 = 0.3
        (Sampling(top_p=0.7), _renorm(PROBS, [0, 1])),
        (Sampling(top_k=3), _renorm(PROBS, [0, 1, 2])),
        (Sampling(min_p=0.5), _renorm(PROBS, [0, 1])),  # kept: p >= 0.5 * 0.5
        # logits / 2: p^(1/2) renormalised
        (Sampling(temperature=2.0), _renorm(np.sqrt(PROBS), [0, 1, 2, 3])),
        # tempered 0.379, 0.294, 0.208, 0.120: cumulative from the bottom 0.120, 0.328, 0.621: two dropped
        (Sampling(temperature=2.0, top_p=0.5), _renorm(np.sqrt(PROBS), [0, 1])),
        (Sampling(temperature=0.0, top_p=0.1), np.log(PROBS)),  # greedy: the temperature-1 distribution
        (PLAIN, np.log(PROBS)),
    ],
)
def test_shaping_by_hand(sampling: Sampling, expected: np.ndarray) -> None:
    got = _lp(sampling)
    kept = np.isfinite(expected)
    np.testing.assert_allclose(got[kept], expected[kept], atol=1e-6)
    assert (got[~kept] < -1e8).all()  # cut: CUT, finite


def test_a_kept_token_stays_in() -> None:
    got = _lp(Sampling(top_p=0.7), keep=[3])
    np.testing.assert_allclose(got[[0, 1, 3]], _renorm(PROBS, [0, 1, 3])[[0, 1, 3]], atol=1e-6)
    assert got[2] < -1e8


def test_gradients_flow_to_kept_logits_only() -> None:
    logits = torch.tensor(np.log(PROBS), dtype=torch.float32)[None].requires_grad_()
    lp = torch.log_softmax(draw_logits(logits, Sampling(temperature=2.0, top_k=2)), -1)
    lp[0, 0].backward()
    g = logits.grad[0]
    assert g[0] != 0 and g[1] != 0 and g[2] == 0 and g[3] == 0
    # d/dz0 of log softmax(z/2)_0 over the kept two = (1 - p0') / 2
    p0 = math.sqrt(0.5) / (math.sqrt(0.5) + math.sqrt(0.3))
    assert float(g[0]) == pytest.approx((1 - p0) / 2, abs=1e-6)


def test_agrees_with_vllms_sampler() -> None:
    """vLLM's own min-p, top-k and top-p (its CPU sampler's `apply_top_k_top_p`, in the order its sampler
    applies them) on random logits over a vocabulary of 5,000: the same cut, the same log-softmax."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5000, generator=gen) * 3
    for s in (Sampling(temperature=0.7, top_p=0.9), Sampling(temperature=2.0, top_k=40),
              Sampling(temperature=1.3, min_p=0.05, top_k=100, top_p=0.8), Sampling(top_p=0.5)):
        ref = logits / s.temperature
        if s.min_p:
            probs = ref.softmax(-1)
            ref = ref.masked_fill(probs < probs.amax(-1, keepdim=True) * s.min_p, float("-inf"))
        k = torch.full((6,), s.top_k) if s.top_k else None
        p = torch.full((6,), s.top_p) if s.top_p < 1 else None
        ref = apply_top_k_top_p(ref.clone(), k, p)
        ours = draw_logits(logits, s)
        assert torch.equal(torch.isinf(ref), ours == CUT), s
        kept = torch.isfinite(ref)
        torch.testing.assert_close(ref.log_softmax(-1)[kept], ours.log_softmax(-1)[kept], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("sampling", "reason"),
    [
        (Sampling(repetition_penalty=1.2), "repetition_penalty"),
        (Sampling(min_tokens=3), "min_tokens"),
        (Sampling(temperature=0.7, logprobs="raw"), "raw distribution"),
        (Sampling(top_p=0.9, logprobs="raw"), "raw distribution"),
    ],
)
def test_untrainable(sampling: Sampling, reason: str) -> None:
    assert reason in (sampling.untrainable() or "")


@pytest.mark.parametrize("sampling", [PLAIN, Sampling(temperature=0.0, logprobs="raw"), Sampling(logprobs="raw"),
                                      Sampling(temperature=0.3, top_p=0.2, top_k=5, min_p=0.1)])
def test_trainable(sampling: Sampling) -> None:
    assert sampling.untrainable() is None


def test_json_round_trip() -> None:
    s = Sampling(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05)
    assert Sampling.from_json(s.to_json()) == s


@pytest.mark.parametrize(("asked", "drawn"), [(0.0, 0.0), (5e-324, 0.0), (9e-6, 0.0), (1e-5, 0.01), (0.002, 0.01),
                                              (0.01, 0.01), (0.7, 0.7), (2.0, 2.0)])
def test_the_temperature_every_engine_draws_at(asked, drawn):
    # vLLM draws greedily below its epsilon (1e-5) and raises (0, 0.01) to 0.01: the record must say what was drawn
    assert drawn_temperature(asked) == drawn


def test_the_cut_works_through_long_rows_in_pieces():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(600, 300, generator=gen) * 2  # more positions than one piece (CUT_ROWS)
    s = Sampling(temperature=0.8, top_k=20, top_p=0.9)
    whole = draw_logits(logits, s)
    rows = torch.cat([draw_logits(logits[i:i + 1], s) for i in range(600)])
    assert torch.equal(whole == CUT, rows == CUT)
