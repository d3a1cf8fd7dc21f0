"""The learner trains an agent's episode as one sample, on the tiny MoE and a real SQLite store: the
policy gradient reaches every turn's action tokens and never an observation token (checked on the
logits' gradient at their positions), the critic sees the whole trajectory, a middle turn's earlier
rating leaves its turns as context for the final rating, deleting a turn takes the episode out of
training, and an episode over `max_episode_tokens` is counted, not trained."""

from __future__ import annotations

import numpy as np
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.objective import policy_objective
from liveloop.learner.online import OnlineLearner
from liveloop.rl.batch import make_batch, response_logprobs
from liveloop.store import FeedbackRecord, ResponseRecord
from liveloop.store.linking import LinkKeys

END = 3  # a stop token for linking (any id the tiny vocabulary has)
PROMPT = (40, 41, 42, END, 43)
TURN1 = (50, 51, 52, 53, END)  # the tool call
OBS = (60, 61, 62, END, 43)  # the tool's result and the next assistant header
TURN2 = (70, 71, 72, END)  # the answer


def _turn(rid, prompt, response, lp=-2.0, key="k"):
    return ResponseRecord(rid, key, "m", 0, "chat", tuple(prompt), tuple(response), (lp,) * len(response), "stop", 1.0, 1.0, 1.0,
                          link=LinkKeys.of(prompt, response, (END,)))


def _episode(store, key="k"):
    store.feedback.write_batch([_turn("t1", PROMPT, TURN1, key=key)])
    store.feedback.write_batch([_turn("t2", PROMPT + TURN1 + OBS, TURN2, key=key)])
    assert store.feedback.get_response("t2").parent_id == "t1"


def _learner(store, tmp_path, model_dir, **kw):
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=100, publish_every_seconds=3600, **kw)
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def test_an_episode_trains_as_one_sample_on_every_turns_actions_and_no_observation(store, tmp_path, model_dir):
    _episode(store)
    store.feedback.put_feedback(FeedbackRecord("t2", "k", 1))
    learner = _learner(store, tmp_path, model_dir)
    (f, r), = store.feedback.rated_after(0, 10)
    sample = learner.ratings.sample(f, r)
    assert sample.prompt_ids.tolist() == list(PROMPT) and sample.response_ids.tolist() == list(TURN1 + OBS + TURN2)
    batch = make_batch([sample])
    with torch.no_grad():  # behave on-policy, so the ratio mask keeps every action token
        own = response_logprobs(learner.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch)
    batch = make_batch([type(sample)(**{**sample.__dict__, "behavior_logprobs": (own[0] * batch.action_mask[0]).numpy()})])
    values = learner.critic.values(batch).float()  # the critic values the whole trajectory, observations included
    assert values.shape == (1, len(TURN1 + OBS + TURN2))
    advantages, _ = learner.method.advantages(batch, values)
    caught = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        caught["logits"] = output

    hook = learner.policy.lm_head.register_forward_hook(keep)
    try:
        loss, _, _ = policy_objective(learner.policy, learner.method, "k1", 0.0, batch, advantages, torch.zeros_like(batch.versions), None)
        loss.backward()
    finally:
        hook.remove()
    p = len(PROMPT) - (batch.input_ids.shape[1] - caught["logits"].shape[1])  # the head ran on the scored positions only
    grad = caught["logits"].grad[0, p - 1 : p - 1 + batch.width].abs().sum(-1)  # position p-1+t predicts response token t
    first, obs, last = range(0, 5), range(5, 10), range(10, 14)
    assert all(grad[t] == 0 for t in obs), grad  # observation tokens are never trained
    assert all(grad[t] > 0 for t in first), grad  # the earlier turn's tool call is
    assert all(grad[t] > 0 for t in last), grad
    made = learner.ratings.stats()["learner/episodes"]
    assert learner.step() and learner.state.last_metrics["learner/episodes"] == made + 1  # the step trained it as an episode


def test_a_middle_rating_trains_its_turns_and_the_final_rating_only_the_turns_after(store, tmp_path, model_dir):
    _episode(store)
    store.feedback.put_feedback(FeedbackRecord("t1", "k", 1))
    store.feedback.put_feedback(FeedbackRecord("t2", "k", 0))
    learner = _learner(store, tmp_path, model_dir)
    (f1, r1), (f2, r2) = store.feedback.rated_after(0, 10)
    assert learner.ratings.sample(f1, r1).action_mask.tolist() == [1] * len(TURN1)  # the trajectory up to turn 1
    second = learner.ratings.sample(f2, r2)
    assert second.action_mask.tolist() == [0] * len(TURN1 + OBS) + [1] * len(TURN2)  # turn 1 was credited already
    assert learner.step() and learner.step() and learner.state.samples == 2  # one of a key's per step


def test_deleting_a_turn_takes_its_episode_out_of_training(store, tmp_path, model_dir):
    _episode(store)
    store.feedback.put_feedback(FeedbackRecord("t2", "k", 1))
    store.rights.delete_response("t1", "k")  # the later turn carries it: it goes too, with its rating
    assert store.feedback.rated_after(0, 10) == []
    assert not _learner(store, tmp_path, model_dir).step()


def test_forgetting_a_key_takes_its_episodes(store, tmp_path, model_dir):
    _episode(store, key="k")
    store.feedback.put_feedback(FeedbackRecord("t2", "k", 1))
    store.rights.forget_key("k")
    assert store.feedback.rated_after(0, 10) == [] and store.episodes.episode("t2") is None


def test_an_episode_over_the_bound_is_counted_not_trained(store, tmp_path, model_dir):
    _episode(store)
    store.feedback.put_feedback(FeedbackRecord("t2", "k", 1))
    learner = _learner(store, tmp_path, model_dir, max_episode_tokens=len(PROMPT + TURN1 + OBS + TURN2) - 1)
    assert not learner.step()
    assert learner.ratings.stats()["learner/episodes_skipped_too_long"] == 1.0
