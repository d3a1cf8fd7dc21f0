"""Hand-computed tiny tensors for the BGPO / VRPO-OL / diffu-GRPO losses (arithmetic in the comments),
BGPO's on-policy equivalence with VRPO-OL, and per-sample backward == one backward on the sum."""

from __future__ import annotations

import math

import pytest
import torch

from liveloop.diffusion.elbo import draw_masks, elbo_terms, sample_elbo
from liveloop.diffusion.losses import (
    bgpo_loss,
    bgpo_sample_loss,
    diffu_grpo_loss,
    vrpo_ol_loss,
)


def test_bgpo_tangent_and_jensen_bounds():
    # one MC sample (n_t = 1), d = [0.5, 0.5], A = [1, -1]
    l_theta = torch.tensor([0.5, 0.5], requires_grad=True)
    l_old = torch.zeros(2)
    loss, m = bgpo_sample_loss(l_theta, l_old, torch.tensor([1.0, -1.0]), n_t=1)
    # g = [(1 + 0.5) * 1, exp(0.5) * (-1)] = [1.5, -1.6487]; loss = -(1.5 - 1.6487) / 2 = 0.07436
    assert loss.item() == pytest.approx(-(1.5 - math.exp(0.5)) / 2)
    loss.backward()
    # d/dl: A >= 0 -> -A / 2 = -0.5;  A < 0 -> -exp(d) A / 2 = exp(0.5) / 2 = 0.8244
    assert l_theta.grad.tolist() == pytest.approx([-0.5, math.exp(0.5) / 2])
    assert m["bgpo/mean_d"] == pytest.approx(0.5)
    # n_t = 4 divides each sample's term: same d -> a quarter of the value
    quarter, _ = bgpo_sample_loss(l_theta, l_old, torch.tensor([1.0, -1.0]), n_t=4)
    assert quarter.item() == pytest.approx(loss.item() / 4)


def test_bgpo_bound_is_below_the_objective():
    # per response: mean_j g_j <= exp(mean_j d_j) * A (a lower bound), equal at d = 0
    torch.manual_seed(0)
    d = torch.randn(6, 5)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 3.0])
    bound, _ = bgpo_loss(d, torch.zeros_like(d), adv)
    objective, _ = vrpo_ol_loss(d, torch.zeros_like(d), adv)
    assert -bound.item() <= -objective.item() + 1e-6  # losses are negated objectives


def test_bgpo_clip_and_dual_clip():
    # A = 1, d = 0.5: f = 1.5, clip(1.5, 0.8, 1.2) = 1.2 -> surrogate min(1.5, 1.2) = 1.2, no gradient
    lt = torch.tensor([0.5], requires_grad=True)
    loss, m = bgpo_sample_loss(lt, torch.zeros(1), torch.tensor([1.0]), n_t=1, clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and lt.grad.item() == 0.0 and m["bgpo/clip_fraction"] == 1.0
    # A = -1, d = ln 4: f = 4; PPO keeps min(-4, -1.2) = -4; dual-clip c = 3 floors it at -3, no gradient
    lt = torch.tensor([math.log(4.0)], requires_grad=True)
    loss, _ = bgpo_sample_loss(lt, torch.zeros(1), torch.tensor([-1.0]), n_t=1, clip_eps=0.2, dual_clip=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(3.0) and lt.grad.item() == 0.0
    # without dual-clip: loss 4, gradient -(exp(d) * A) = 4
    lt = torch.tensor([math.log(4.0)], requires_grad=True)
    loss, _ = bgpo_sample_loss(lt, torch.zeros(1), torch.tensor([-1.0]), n_t=1, clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(4.0) and lt.grad.item() == pytest.approx(4.0)


def test_bgpo_huge_d_on_the_tangent_side_has_finite_gradient():
    lt = torch.tensor([200.0], requires_grad=True)  # exp(200) overflows float32
    loss, _ = bgpo_sample_loss(lt, torch.zeros(1), torch.tensor([1.0]), n_t=1)
    loss.backward()
    assert math.isfinite(loss.item()) and lt.grad.item() == -1.0


def test_vrpo_ol_hand_computed():
    # d rows: mean [0.5 - 0.5] / 2 = 0 -> ratio 1;  [ln 2, ln 2] -> ratio 2.  A = [1, -1]
    lt = torch.tensor([[0.5, -0.5], [math.log(2), math.log(2)]], requires_grad=True)
    loss, m = vrpo_ol_loss(lt, torch.zeros(2, 2), torch.tensor([1.0, -1.0]))
    # loss = -(1 * 1 + 2 * (-1)) / 2 = 0.5
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    # d loss / d l_ij = -ratio_i * A_i / (N * n_t) = [[-0.25, -0.25], [0.5, 0.5]]
    assert lt.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.5, 0.5])
    assert m["vrpo/mean_ratio"] == pytest.approx(1.5)


def test_bgpo_equals_vrpo_ol_on_policy():
    torch.manual_seed(0)
    old = torch.randn(5, 8)
    adv = torch.tensor([1.3, -0.7, 0.0, -2.0, 0.4])
    a = old.clone().requires_grad_()
    b = old.clone().requires_grad_()
    lb, _ = bgpo_loss(a, old, adv, clip_eps=0.2, dual_clip=3.0)
    lv, _ = vrpo_ol_loss(b, old, adv, clip_eps=0.2, dual_clip=3.0)
    lb.backward()
    lv.backward()
    # value: sum_j A / n_t = A = exp(0) A; gradient A / (N n_t) per term for both
    assert lb.item() == pytest.approx(lv.item(), abs=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-7)
    assert a.grad[0, 0].item() == pytest.approx(-1.3 / (5 * 8))


def test_diffu_grpo_hand_computed():
    # ratios [1, 1.5] for one response with A = 1: per token -min(r, clip(r)) = [-1, -1.2]; mean -1.1
    lp = torch.tensor([[0.0, math.log(1.5)]], requires_grad=True)
    loss, m = diffu_grpo_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]))
    assert loss.item() == pytest.approx(-1.1)
    loss.backward()
    # token 1 is clipped (no gradient); token 0: -ratio * A / 2 = -0.5
    assert lp.grad[0].tolist() == pytest.approx([-0.5, 0.0])
    assert m["diffu_grpo/clip_fraction"] == 0.5


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_per_sample_backward_equals_backward_on_the_sum(tiny_group):
    model, tok, prompt = tiny_group
    responses = torch.randint(6, len(tok), (3, 12))
    draw = draw_masks(3, 12, n_t=4, generator=torch.Generator().manual_seed(0))
    adv = torch.tensor([1.0, -0.5, -0.5])
    with torch.no_grad():
        old = elbo_terms(model, prompt, responses, draw)
        for p in model.parameters():  # move off-policy so that d != 0 and both bound branches matter
            p.add_(0.05 * torch.randn_like(p))
    # (a) one graph holding all n_t samples
    model.zero_grad()
    total, _ = bgpo_loss(elbo_terms(model, prompt, responses, draw), old, adv, clip_eps=0.2, dual_clip=3.0)
    total.backward()
    g_sum = _grads(model).clone()
    # (b) one sample's graph at a time, gradients accumulating
    model.zero_grad()
    value = 0.0
    for j in range(4):
        lj = sample_elbo(model, prompt, responses, draw.masks[:, j], draw.counts[:, j])
        loss_j, _ = bgpo_sample_loss(lj, old[:, j], adv, n_t=4, clip_eps=0.2, dual_clip=3.0)
        loss_j.backward()
        value += loss_j.item()
    assert value == pytest.approx(total.item(), abs=1e-6)
    assert (old != 0).all() and g_sum.abs().sum() > 0
    assert torch.allclose(_grads(model), g_sum, atol=1e-6, rtol=1e-4)
