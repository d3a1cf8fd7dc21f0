"""An episode (an agent's turns, linked by the store) as ONE sample for the learner: its layout
(liveloop/episodes.py: every turn's sampled tokens actions with their own behaviour logprobs, versions
and grammar, everything between them observation: mask 0, no loss, skipped by `gae_skip_observations`)
and the rating's reward on its last token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from liveloop.episodes import EpisodeMismatch, episode_layout, runs, start_turn  # noqa: F401 (re-exported)
from liveloop.rl.batch import Sample


def episode_sample(
    turns: Sequence[Any], prompt_ids: np.ndarray, reward: float, api_key_id: str = "", credited_through: int = -1,
    observations_as_actions: bool = False,
) -> Sample:
    """The sample of an episode rated at its last turn (`episode_layout`'s arguments, with the rating's
    reward and key). `observations_as_actions`: the ablation SAO argues against: the observation tokens
    after the first trained turn are in the loss and the GAE too, their behaviour logprobs NaN (nothing
    sampled them: the learner scores them on-policy, `OnlineLearner`)."""
    lay = episode_layout(turns, prompt_ids, credited_through, observations_as_actions)
    return Sample(
        lay.prompt_ids, lay.response_ids, lay.behavior_logprobs, lay.action_mask, float(reward), turns[-1].policy_version,
        api_key_id, version_spans=runs(lay.versions), grammar_spans=lay.grammar_spans, sampling_spans=lay.sampling_spans,
    )
