"""Critic cold start on the tiny MoE: rollouts scored by a configured reward, fitting until the
explained variance passes the threshold, saved where the learner resumes from it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from liveloop.clients.rewards import corpus_prompt, make_reward
from liveloop.critic.config import CriticConfig
from liveloop.critic.pretrain import RolloutPlan, collect_rollouts, explained_variance, pretrain_critic
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model
from liveloop.learner.config import LearnerConfig
from liveloop.learner.critic_start import pretrain_for_learner
from liveloop.learner.online import OnlineLearner
from liveloop.store import Store, StoreConfig


@pytest.mark.learning
def test_pretrain_reaches_threshold(model_dir):
    reward = make_reward("style:chuunibyou")
    plan = RolloutPlan(prompt=corpus_prompt, reward=lambda i, prompt, text: reward(text), count=24, max_tokens=24, seed=0)
    samples = collect_rollouts(model_dir, plan, progress=False)
    rate = sum(s.reward for s in samples) / len(samples)
    assert 0 < rate < 1  # the base model mixes styles
    torch.manual_seed(0)
    critic = Critic(build_value_model(model_dir), CriticConfig(learning_rate=1e-3))
    before = explained_variance(critic, samples, 8)
    result = pretrain_critic(critic, samples, ev_threshold=0.5, max_epochs=30, progress=False)
    assert before < 0.5 <= result["critic/explained_variance"]
    assert result["critic/pretrain_epochs"] >= 1


def test_learner_resumes_with_the_pretrained_critic(tmp_path, model_dir):
    store = Store(StoreConfig(url=f"sqlite:///{tmp_path / 's.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    learner_cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"))
    critic_cfg = CriticConfig(learning_rate=1e-3, pretrain_reward="style:cute", pretrain_rollouts=16, pretrain_max_tokens=16,
                              pretrain_ev_threshold=0.3, pretrain_max_epochs=10)
    with pytest.raises(ValueError, match="critic.pretrain_reward is not set"):  # rollouts need a reward
        pretrain_for_learner(store.versions, store.feedback, learner_cfg, critic_cfg, model_dir, progress=False)
    result = pretrain_for_learner(
        store.versions, store.feedback, learner_cfg, critic_cfg, model_dir, prompt=corpus_prompt,
        reward=make_reward(critic_cfg.pretrain_reward), progress=False,
    )
    assert result["version"] == 0 and result["critic_dir"].endswith("v000000/critic")
    learner = OnlineLearner.resume(
        learner_cfg, dataclasses.replace(critic_cfg), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    saved = build_value_model(result["critic_dir"]).state_dict()
    assert all(torch.equal(saved[k], v) for k, v in learner.critic.model.state_dict().items())
    store.close()
