"""The online learner in-process on the tiny MoE and a real SQLite store: publishing with the cursor,
resuming exactly where the last version left off, skipping poisoned steps, refusing to publish
non-finite weights, and offline replay through the same code path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.learner.replay import replay
from liveloop.store import FeedbackRecord, ResponseRecord, Store


def _rate(store: Store, n: int, start: int = 0, poison: set[int] = frozenset()) -> None:
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        m = 8
        # poison: finite logprobs no sampled token has (a NaN one is not even scored: test_unscorable.py), whose
        # ratio overflows to inf and the step's loss to NaN
        lps = np.full(m, -2.0, np.float32) if i not in poison else np.full(m, -1e30, np.float32)
        rec = ResponseRecord(
            f"r{i}", "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)), tuple(int(x) for x in rng.integers(5, 500, m)),
            tuple(float(x) for x in lps), "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", i % 2))


def _cfg(tmp_path, **kw) -> LearnerConfig:
    return LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=4, publish_every_seconds=3600, **kw)


def test_publish_resume_exactly_once(store, tmp_path, model_dir):
    _rate(store, 10)
    learner = OnlineLearner.resume(
        _cfg(tmp_path), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    for _ in range(6):  # publishes after step 4; steps 5-6 are in memory only ("crash" here)
        assert learner.step()
    published = store.versions.versions_with_status("published")
    assert [v.version for v in published] == [1] and published[0].samples_used == 4
    assert store.feedback.get_cursor("sao") == 4 and store.versions.cursor_version("sao") == 1
    # a new learner (after a crash) resumes from version 1 at cursor 4: ratings 5..10 are trained once
    again = OnlineLearner.resume(
        _cfg(tmp_path), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert again.state.version == 1 and again.state.cursor == 4
    from transformers import AutoModelForCausalLM

    v1 = AutoModelForCausalLM.from_pretrained(published[0].checkpoint_path).state_dict()
    assert all(torch.equal(v1[k], v) for k, v in again.policy.state_dict().items())
    again.run(lambda: False, max_steps=6)  # 6 more steps, then publishes what is pending
    versions = store.versions.versions_with_status("published")
    # lineage 0 -> 1 (4 ratings) -> 2 (4) -> 3 (2): every rating trained exactly once
    assert [(v.version, v.parent, v.samples_used) for v in versions] == [(1, 0, 4), (2, 1, 4), (3, 2, 2)]
    assert store.feedback.get_cursor("sao") == 10 and store.versions.cursor_version("sao") == 3


def test_poisoned_step_is_skipped_and_not_published(store, tmp_path, model_dir):
    _rate(store, 1, poison={0})
    learner = OnlineLearner.resume(
        _cfg(tmp_path), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    learner.run(lambda: False, max_steps=1)
    assert learner.state.skipped_steps == 1
    assert all(torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())
    assert store.versions.versions_with_status("published") == []  # nothing published from the poisoned step
    assert store.feedback.get_cursor("sao") == 1  # but the rating was consumed: it is not retried forever


def test_non_finite_weights_are_never_published(store, tmp_path, model_dir):
    _rate(store, 1)
    learner = OnlineLearner.resume(
        _cfg(tmp_path), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert learner.step()
    with torch.no_grad():
        next(learner.policy.parameters()).fill_(float("inf"))
    assert learner.publish() is None
    assert store.versions.versions_with_status("published") == [] and store.feedback.get_cursor("sao") == 0


def test_replay_trains_from_a_version_as_candidates(store, tmp_path, model_dir):
    _rate(store, 5)
    result = replay(
        _cfg(tmp_path), CriticConfig(), model_dir, from_version=0, progress=False,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert result["steps"] == 5 and result["samples"] == 5
    candidates = store.versions.versions_with_status("candidate")
    assert len(candidates) == 2 and sum(v.samples_used for v in candidates) == 5  # published at 4, then 1
    assert store.versions.versions_with_status("published") == []  # never swapped in on its own
    assert store.feedback.get_cursor(result["cursor"]) == 5 and store.feedback.get_cursor("sao") == 0
