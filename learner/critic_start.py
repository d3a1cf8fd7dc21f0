"""`liveloop critic pretrain`: the critic's cold start for the version a learner will resume from.

1. find that version (the learner's cursor version, else 0 = the base model) and load its policy;
2. gather rated samples: rollouts of that policy on the default prompts scored by the configured
   reward, or (from_store) the rated responses already in the store;
3. fit a fresh critic to Monte-Carlo returns until the explained variance passes the threshold;
4. save it where `OnlineLearner.resume` looks for that version's critic.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from liveloop.checkpoint import save_atomically
from liveloop.critic.config import CriticConfig
from liveloop.critic.pretrain import pretrain_critic
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model
from liveloop.learner.batch import Sample
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import critic_dir_for
from liveloop.learner.rewards import make_reward
from liveloop.learner.rollout import chat_prompt_ids, sample_reply
from liveloop.model.corpus import TOPICS, make_prompt
from liveloop.store import Store


def rollout_samples(policy_dir: str, reward_spec: str, n: int, max_tokens: int, seed: int, progress: bool) -> list[Sample]:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reward = make_reward(reward_spec)
    tok = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in tqdm(range(n), desc="rollouts", disable=not progress):
        prompt = chat_prompt_ids(tok, make_prompt(TOPICS[i % len(TOPICS)], rng))
        r = sample_reply(model, tok, prompt, max_tokens, gen)
        samples.append(Sample.from_rollout(r, reward(r.text)))
    return samples


def store_samples(store: Store, limit: int = 100_000) -> list[Sample]:
    return [Sample.from_rated(f, r) for f, r in store.rated_after(0, limit)]


def pretrain_for_learner(
    store: Store, learner: LearnerConfig, critic: CriticConfig, base_model_dir: Path,
    from_store: bool = False, progress: bool = True,
) -> dict[str, Any]:
    # 1. the version the learner resumes from
    version = store.cursor_version(learner.cursor_name) or 0
    record = store.get_version(version)
    policy_dir = record.checkpoint_path if version > 0 and record and record.checkpoint_path else str(base_model_dir)
    # 2. rated samples
    if from_store:
        samples = store_samples(store)
    else:
        if not critic.pretrain_reward:
            raise ValueError("critic.pretrain_reward is not set (contains:WORD or style:NAME), or use --from-store")
        samples = rollout_samples(policy_dir, critic.pretrain_reward, critic.pretrain_rollouts, critic.pretrain_max_tokens, learner.seed, progress)
    # 3. fit
    torch.manual_seed(learner.seed)
    model = Critic(build_value_model(policy_dir), critic)
    result = pretrain_critic(model, samples, critic.pretrain_ev_threshold, critic.pretrain_max_epochs, progress=progress)
    # 4. save where the learner looks
    target = save_atomically(critic_dir_for(learner, version), lambda tmp: model.save(str(tmp)))
    return result | {"version": version, "critic_dir": str(target), "reward_rate": float(np.mean([s.reward for s in samples]))}
