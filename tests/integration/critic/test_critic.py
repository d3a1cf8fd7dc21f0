"""The critic on the tiny MoE: attention parameters do not change over K value steps while the
experts, router and head do; the value loss falls on a fixed batch."""

import numpy as np
import torch

from liveloop.critic.config import CriticConfig
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model
from liveloop.rl.advantages import gae_skip_observations
from liveloop.rl.batch import Sample, make_batch


def _samples():
    rng = np.random.default_rng(0)
    out = []
    for i in range(4):
        n = 6 + i
        out.append(
            Sample(
                prompt_ids=rng.integers(5, 500, 5),
                response_ids=rng.integers(5, 500, n),
                behavior_logprobs=np.full(n, -1.0, np.float32),
                action_mask=np.ones(n, np.uint8),
                reward=float(i % 2),
                policy_version=0,
            )
        )
    return out


def test_frozen_attention_and_k_steps(model_dir):
    torch.manual_seed(0)
    critic = Critic(build_value_model(model_dir), CriticConfig(value_steps=2, learning_rate=1e-2))
    assert critic.frozen and all("self_attn." in n for n in critic.frozen)
    before = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
    batch = make_batch(_samples())
    values = critic.values(batch)
    returns = torch.stack([gae_skip_observations(values[b], float(batch.rewards[b]), batch.action_mask[b])[1] for b in range(4)])
    first = critic.update(batch, returns)
    for _ in range(5):
        last = critic.update(batch, returns)
    after = dict(critic.model.named_parameters())
    for name in critic.frozen:
        assert torch.equal(before[name], after[name]), f"{name} changed"
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("experts" in n for n in changed) and any("mlp.gate" in n for n in changed) and any("score" in n or "classifier" in n for n in changed)
    assert np.isfinite(first["critic/grad_norm"]) and last["critic/value_loss"] < first["critic/value_loss"]


def _critic(model_dir, attention_dropout: float = 0.0) -> Critic:
    torch.manual_seed(0)
    model = build_value_model(model_dir)
    model.config.attention_dropout = attention_dropout
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = attention_dropout
    return Critic(model, CriticConfig(value_steps=2, learning_rate=1e-2))


def _returns(values, batch):
    return torch.stack([gae_skip_observations(values[b], float(batch.rewards[b]), batch.action_mask[b])[1] for b in range(len(values))])


def test_the_values_are_the_first_value_steps_forward(model_dir):
    """values_for_update: the values (the same bits as their own no-grad forward) and the first value
    step's forward in one; the K steps on it end where K steps with their own forwards end."""
    batch = make_batch(_samples())
    shared, alone = _critic(model_dir), _critic(model_dir)
    values, first = shared.values_for_update(batch)
    assert first is not None and first.requires_grad and not values.requires_grad
    assert torch.equal(values, alone.values(batch))
    returns = _returns(values, batch)
    m_shared, m_alone = shared.update(batch, returns, first), alone.update(batch, returns)
    assert m_shared == m_alone
    a, b = shared.model.state_dict(), alone.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], _critic(model_dir).model.state_dict()[k]) for k in a)  # the steps did move it


def test_a_critic_with_dropout_keeps_its_own_eval_forward_for_the_values(model_dir):
    critic = _critic(model_dir, attention_dropout=0.5)
    assert critic.dropout
    batch = make_batch(_samples())
    values, first = critic.values_for_update(batch)
    assert first is None and torch.equal(values, critic.values(batch))  # eval mode: nothing dropped
    assert np.isfinite(critic.update(batch, _returns(values, batch), first)["critic/grad_norm"])


def test_has_dropout_reads_modules_and_config_rates():
    from types import SimpleNamespace

    from torch import nn

    from liveloop.critic.value_model import has_dropout

    assert not has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))
    assert has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    quiet = nn.Linear(2, 2)
    quiet.config = SimpleNamespace(attention_dropout=0.0, classifier_dropout=None, resid_pdrop=0.0)
    assert not has_dropout(quiet)
    quiet.config.resid_pdrop = 0.1
    assert has_dropout(quiet)
