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
