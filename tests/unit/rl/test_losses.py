"""Hand-computed tiny tensors for the policy and value losses (arithmetic in the comments)."""

import math

import pytest
import torch

from liveloop.rl.losses import clipped_surrogate, kl_penalty, ppo_clip_loss, sao_policy_loss, token_mean, value_loss


def test_sao_two_sided_mask_values_and_gradients():
    # behavior logprobs 0, current logprobs log(ratio): ratios [1.0, 1.5, 0.5, 2.0]
    ratios = torch.tensor([[1.0, 1.5, 0.5, 2.0]])
    lp = torch.log(ratios).requires_grad_()
    blp = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    # band (1 - 0.3, 1 + 0.8) = (0.7, 1.8): keep [1, 1, 0 (low), 0 (high)]
    loss, m = sao_policy_loss(lp, blp, adv, mask, eps_low=0.3, eps_high=0.8, staleness=torch.tensor([2.0]))
    # loss = -(1*1.0*1 + 1*1.5*(-2)) / 4 = -(1 - 3) / 4 = 0.5
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    # d loss / d lp_t = -keep_t * ratio_t * A_t / 4 = [-0.25, 0.75, 0, 0]
    assert lp.grad.tolist()[0][:2] == pytest.approx([-0.25, 0.75])
    assert lp.grad[0, 2].item() == 0.0 and lp.grad[0, 3].item() == 0.0  # masked: exactly zero
    assert m["learner/kept_fraction"] == 0.5
    assert m["learner/masked_low_fraction"] == 0.25 and m["learner/masked_high_fraction"] == 0.25
    assert m["learner/mean_ratio"] == pytest.approx(1.25)  # (1 + 1.5 + 0.5 + 2) / 4
    assert m["learner/staleness_mean"] == 2.0


def test_sao_mask_applies_to_negative_advantages_too():
    # ratio 2.0 above 1 + eps_high with A < 0: PPO would still push it down; SAO gives it no gradient
    lp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, _ = sao_policy_loss(lp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), 0.3, 0.8)
    loss.backward()
    assert loss.item() == 0.0 and lp.grad.item() == 0.0


def test_sao_observation_tokens_and_padding_do_not_count():
    # mask [1, 0, 1]: the middle token is an observation with a huge advantage; ratios all 1
    lp = torch.zeros(1, 3, requires_grad=True)
    adv = torch.tensor([[2.0, 100.0, 2.0]])
    loss, m = sao_policy_loss(lp, torch.zeros(1, 3), adv, torch.tensor([[1.0, 0.0, 1.0]]), 0.3, 5.0)
    # -(2 + 2) / 2 action tokens = -2
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert lp.grad[0, 1].item() == 0.0
    assert m["learner/kept_fraction"] == 1.0


def test_ppo_clip():
    # ratio 1.5, A = 1: min(1.5, clip 1.2) = 1.2 -> loss -1.2, no gradient through the clipped side
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, m = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1), eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and lp.grad.item() == 0.0 and m["learner/clip_fraction"] == 1.0
    # ratio 1.5, A = -1: min(-1.5, -1.2) = -1.5 -> the unclipped term wins, gradient -(-1.5) = 1.5
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(1.5) and lp.grad.item() == pytest.approx(1.5)


def test_value_loss_token_mean_over_actions():
    values = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 1.0, 1.0]])
    loss, _ = value_loss(values, returns, torch.tensor([[1.0, 1.0, 0.0]]))
    # 0.5 * ((1-1)^2 + (2-1)^2) / 2 = 0.25; the padded third token does not count
    assert loss.item() == pytest.approx(0.25)
    loss.backward()
    # d/dV = (V - R) / 2 on action tokens: [0, 0.5, 0]
    assert values.grad.tolist() == [[0.0, 0.5, 0.0]]


def test_kl_penalty_k3():
    lp = torch.tensor([[0.0, math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0]])
    kl, m = kl_penalty(lp, ref, torch.ones(1, 2))
    # token 0: d = 0 -> 0;  token 1: d = 0 - log 0.5 = log 2 -> e^{log 2} - log 2 - 1 = 1 - log 2
    assert kl.item() == pytest.approx((1 - math.log(2)) / 2)
    kl.backward()
    # d/dlp of exp(ref - lp) - (ref - lp) - 1 = -exp(ref - lp) + 1: token 1 -> (1 - 2) / 2 = -0.5
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.5])


def test_token_mean_counts_action_tokens_only():
    # (1 + 3) / 2 action tokens; an all-zero mask divides by 1, not 0
    assert token_mean(torch.tensor([[1.0, 100.0, 3.0]]), torch.tensor([[1.0, 0.0, 1.0]])).item() == 2.0
    assert token_mean(torch.tensor([[5.0]]), torch.zeros(1, 1)).item() == 0.0


def test_clipped_surrogate_clip_and_dual_clip():
    f = torch.tensor([1.5, 1.5, 0.5, 5.0])
    a = torch.tensor([1.0, -1.0, 1.0, -1.0])
    s, clipped = clipped_surrogate(f, a, clip_eps=0.2)
    # min(fA, clip(f, 0.8, 1.2) A): [min(1.5, 1.2), min(-1.5, -1.2), min(0.5, 0.8), min(-5, -1.2)]
    assert s.tolist() == pytest.approx([1.2, -1.5, 0.5, -5.0])
    assert clipped.tolist() == [True, False, False, False]  # only where the clipped side was smaller
    s, clipped = clipped_surrogate(f, a, clip_eps=0.2, dual_clip=3.0)
    # dual clip for A < 0: max(s, 3A) -> the last entry -5 becomes -3
    assert s.tolist() == pytest.approx([1.2, -1.5, 0.5, -3.0])
    assert clipped.tolist() == [True, False, False, True]
    s, clipped = clipped_surrogate(f, a)  # no clip: f A
    assert s.tolist() == pytest.approx([1.5, -1.5, 0.5, -5.0]) and not clipped.any()


def test_every_ppo_clip_builds_on_the_one_helper():
    from liveloop.diffusion import losses as diffusion_losses
    from liveloop.rl import losses

    assert diffusion_losses.clipped_surrogate is losses.clipped_surrogate
    assert not hasattr(diffusion_losses, "_clipped")
    # the learner's PPO clip and diffu-GRPO agree on the same tokens (one sequence, all actions)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([-1.0])
    learner_loss, lm = losses.ppo_clip_loss(lp, torch.zeros(1, 3), adv[:, None].expand(1, 3), torch.ones(1, 3), eps=0.2)
    diffu_loss, dm = diffusion_losses.diffu_grpo_loss(lp, torch.zeros(1, 3), adv, clip_eps=0.2)
    # per token -min(rA, clip(r)A), A = -1: [-min(-1.5, -1.2), -min(-0.5, -0.8), -min(-1.1, -1.1)] = [1.5, 0.8, 1.1]
    assert learner_loss.item() == pytest.approx(3.4 / 3) and diffu_loss.item() == pytest.approx(3.4 / 3)
    assert lm["learner/clip_fraction"] == pytest.approx(2 / 3) == dm["diffu_grpo/clip_fraction"]  # |r - 1| > 0.2: 1.5, 0.5


def test_exact_kl_by_hand_and_its_pull_grows_where_k3s_saturates():
    from liveloop.rl.losses import exact_kl_penalty, kl_penalty

    ref = torch.log(torch.tensor([[[0.5, 0.5]]]))
    pol = torch.log(torch.tensor([[[0.9, 0.1]]]))
    kl, m = exact_kl_penalty(pol, ref, torch.ones(1, 1))
    assert float(kl) == pytest.approx(0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)) and m["learner/kl"] == pytest.approx(float(kl))
    # a policy far more confident than the reference in the sampled token (the collapse direction):
    # k3's gradient in that token's logprob is 1 - exp(ref - lp) < 1 however far it goes
    for p in (0.9, 0.999, 0.999999):
        lp = torch.tensor([[math.log(p)]], requires_grad=True)
        k3, _ = kl_penalty(lp, torch.tensor([[math.log(0.01)]]), torch.ones(1, 1))
        k3.backward()
        assert 0 < float(lp.grad) < 1
    # the same collapsed policy, pi = (0.9975, 0.0025) against ref = (0.01, 0.99), token 0 sampled: the
    # exact KL's pull on the logits is ten times k3's
    ref = torch.log(torch.tensor([[[0.01, 0.99]]]))
    grads = {}
    for name in ("k3", "exact"):
        logits = torch.tensor([[[6.0, 0.0]]], requires_grad=True)
        logp = torch.log_softmax(logits, -1)
        if name == "k3":
            kl, _ = kl_penalty(logp[:, :, 0], ref[:, :, 0], torch.ones(1, 1))
        else:
            kl, _ = exact_kl_penalty(logp, ref, torch.ones(1, 1))
        kl.backward()
        grads[name] = float(logits.grad.abs().max())
    assert grads["exact"] > 10 * grads["k3"] > 0
