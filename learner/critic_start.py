"""`liveloop critic pretrain`: the critic's cold start for the version a learner will resume from.

1. find that version (the learner's cursor version, else 0 = the base model): its policy is the one
   rolled out and the backbone of the critic;
2. the rated samples: rollouts of that policy on the prompts the caller passes, rated by the reward the
   caller passes (the `[critic]` counts, the learner's seed), or (from_store) the rated responses
   already in the store;
3. `critic.pretrain.pretrain` fits a fresh critic and saves it where `OnlineLearner.resume` looks for
   that version's critic.
The prompts and the reward are arguments: the wiring (`liveloop critic pretrain` in liveloop/cli.py)
supplies the default model's (`clients/rewards.py`); the learner knows no corpus.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from liveloop.critic.config import CriticConfig
from liveloop.critic.pretrain import RolloutPlan, pretrain
from liveloop.learner.config import LearnerConfig
from liveloop.learner.episodes import RatingReads
from liveloop.learner.position import critic_dir_for
from liveloop.rewards import RULE_SPECS
from liveloop.rl.batch import Sample
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.versions import VersionQueries


def store_samples(ratings: RatingReads, limit: int = 100_000) -> list[Sample]:
    """The first `limit` trainable ratings' samples (the store's feedback part reads them)."""
    return [Sample.from_rated(f, r) for f, r in ratings.rated_after(0, limit)]


def rollout_plan(
    critic: CriticConfig, prompt: Callable[[int, random.Random], str], reward: Callable[[str], float], seed: int
) -> RolloutPlan:
    """`[critic]`'s rollout counts over the given prompts, each reply rated by `reward(text)`."""
    return RolloutPlan(
        prompt=prompt, reward=lambda i, p, text: reward(text), count=critic.pretrain_rollouts,
        max_tokens=critic.pretrain_max_tokens, seed=seed,
    )


def pretrain_for_learner(
    versions: VersionQueries, feedback: FeedbackQueries, learner: LearnerConfig, critic: CriticConfig, base_model_dir: Path,
    prompt: Callable[[int, random.Random], str] | None = None, reward: Callable[[str], float] | None = None,
    from_store: bool = False, progress: bool = True,
) -> dict[str, Any]:
    # 1. the version the learner resumes from
    version = versions.cursor_version(learner.cursor_name) or 0
    record = versions.get_version(version)
    policy_dir = record.checkpoint_path if version > 0 and record and record.checkpoint_path else str(base_model_dir)
    # 2. rated samples
    if from_store:
        data: RolloutPlan | list[Sample] = store_samples(feedback)
    else:
        if reward is None or prompt is None:
            raise ValueError(f"critic.pretrain_reward is not set ({RULE_SPECS}), or use --from-store")
        data = rollout_plan(critic, prompt, reward, learner.seed)
    # 3. fit, saved where the learner looks
    target = critic_dir_for(learner, version)
    result = pretrain(policy_dir, critic, target, data, critic.pretrain_ev_threshold, critic.pretrain_max_epochs,
                      seed=learner.seed, progress=progress)
    rate = result.pop("critic/pretrain_reward_rate")
    return result | {"version": version, "critic_dir": str(target), "reward_rate": rate}
