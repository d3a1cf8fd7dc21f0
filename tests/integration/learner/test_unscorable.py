"""Issue 46: a rated reply the learner cannot score (here, the issue's own: tokens its stored grammar
forbids, a JSON schema whose `pattern` matches nothing) is skipped, counted and logged, never raised out
of a step: the good ratings around it train, the cursor moves past it, and learning goes on for everyone.
In-process `OnlineLearner` on the tiny model and a real SQLite store; replies written through the
store's own write path."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.sampling import Sampling
from liveloop.store import FeedbackRecord, ResponseRecord, Store

NOTHING = {"type": "string", "pattern": "^[^\\s\\S]$"}  # compiles; matches no string at all


def _tag(**fmt) -> str:
    from xgrammar.structural_tag import ConstStringFormat, JSONSchemaFormat, StructuralTag

    f = JSONSchemaFormat(json_schema=fmt["schema"]) if "schema" in fmt else ConstStringFormat(value=fmt["text"])
    return StructuralTag(format=f).model_dump_json()


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _reply(
    store: Store, rid: str, response: list[int], grammar: str | None = None, logprob: float = -2.0, reward: int = 1,
    group: str | None = None,
) -> None:
    rng = np.random.default_rng(len(rid) * 131 + sum(map(ord, rid)))
    rec = ResponseRecord(
        rid, "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)), tuple(response),
        (logprob,) * len(response), "stop", 1.0, 1.0, 1.0, grammar=grammar,
        request_meta={"group": group} if group else None,
    )
    store.feedback.write_batch([rec])
    store.feedback.put_feedback(FeedbackRecord(rid, "k", reward))


def _free(i: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(1000 + i).integers(5, 500, 8)]


def _poison(tok) -> list[int]:
    """What vLLM stored: the string's opening quote, then a token the dead-ended grammar never allowed."""
    return tok('"x"', add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _cfg(tmp_path, **kw) -> LearnerConfig:
    return LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_seconds=3600, max_per_key_per_batch=8, **kw)


def test_a_poison_reply_is_skipped_and_the_batch_around_it_trains(store, tmp_path, model_dir, tok, caplog):
    yes = tok("yes", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    _reply(store, "good0", _free(0), reward=0)
    _reply(store, "poison", _poison(tok), grammar=_tag(schema=NOTHING))
    _reply(store, "good1", yes, grammar=_tag(text="yes"))  # constrained and within its grammar: trains under its masks
    _reply(store, "good2", _free(2))
    learner = OnlineLearner.resume(
        _cfg(tmp_path, batch_size=3, publish_every_steps=1), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    with caplog.at_level(logging.WARNING, logger="liveloop.learner.episodes"):
        assert learner.step()
    s = learner.state
    assert (s.step, s.samples, s.skipped_steps, s.version, s.cursor) == (1, 3, 0, 1, 4)  # 3 trained, published past the poison
    m = learner.status().lanes[0].metrics
    assert m["learner/skipped_samples"] == 1.0 and m["learner/skipped_samples_grammar"] == 1.0
    [warning] = [r for r in caplog.records if "poison" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "grammar" in warning.getMessage()
    [v1] = store.versions.versions_with_status("published")
    assert v1.samples_used == 3 and v1.metrics["learner/skipped_samples"] == 1.0
    # later ratings train as ever; the count is cumulative
    for i in (3, 4, 5):
        _reply(store, f"good{i}", _free(i), reward=i % 2)
    assert learner.step() and learner.state.samples == 6 and learner.state.version == 2
    assert store.feedback.get_cursor("sao") == 7
    assert store.versions.versions_with_status("published")[-1].metrics["learner/skipped_samples"] == 1.0


def test_replies_drawn_beyond_the_learners_replay_are_untrained_not_alarmed(store, tmp_path, model_dir):
    """A rated reply drawn under a repetition penalty (its logprobs are the penalised distribution's,
    which the learner does not rebuild) or stored with the raw logprobs of a tempered draw is not
    trained; it is counted as untrained, not as a sample the learner failed to score (the alarm's)."""
    _reply(store, "good0", _free(0))
    for rid, sampling in (("penalised", Sampling(repetition_penalty=1.3)), ("raw", Sampling.logged_raw(0.7, 1.0))):
        rng = np.random.default_rng(7)
        store.feedback.write_batch([ResponseRecord(
            rid, "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)), tuple(_free(5)), (-2.0,) * 8,
            "stop", sampling.temperature, 1.0, 1.0, sampling=sampling,
        )])
        store.feedback.put_feedback(FeedbackRecord(rid, "k", 1))
    _reply(store, "plain", _free(3), logprob=-2.5)  # a plain draw beside them trains
    learner = OnlineLearner.resume(
        _cfg(tmp_path, batch_size=2, publish_every_steps=1), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert learner.step()
    assert (learner.state.samples, learner.state.cursor) == (2, 4)
    m = learner.status().lanes[0].metrics
    assert m["learner/untrained_samples_sampling"] == 2.0 and m["learner/skipped_samples"] == 0.0


def test_a_batch_of_nothing_but_poison_moves_the_cursor_without_a_version(store, tmp_path, model_dir, tok):
    """The crash loop of the issue: a supervisor's restart read the same rating again. Now the rating is
    consumed: its cursor is recorded without a version, and a restarted learner starts past it."""
    _reply(store, "poison", _poison(tok), grammar=_tag(schema=NOTHING))
    _reply(store, "nan", _free(9), logprob=float("nan"))
    learner = OnlineLearner.resume(
        _cfg(tmp_path, batch_size=2), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert not learner.step()  # consumed, not trained
    s = learner.state
    assert (s.step, s.samples, s.pending_cursor) == (0, 0, 2)
    m = learner.status().lanes[0].metrics
    assert m["learner/skipped_samples"] == 2.0
    assert m["learner/skipped_samples_grammar"] == 1.0 and m["learner/skipped_samples_logprobs"] == 1.0
    turns = iter(range(10))
    learner.run(lambda: next(turns) >= 3)  # the loop's last act publishes what is pending: here the cursor alone
    assert store.versions.versions_with_status("published") == []
    assert store.feedback.get_cursor("sao") == 2 and store.versions.cursor_version("sao") == 0
    again = OnlineLearner.resume(
        _cfg(tmp_path, batch_size=2), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert again.state.cursor == 2 and not again.step()
    assert again.status().lanes[0].metrics["learner/skipped_samples"] == 0.0  # nothing read again
    _reply(store, "good0", _free(0))
    _reply(store, "good1", _free(1), reward=0)
    assert again.step() and again.state.samples == 2  # learning goes on


def test_the_sliding_window_and_grpo_skip_it_too(store, tmp_path, model_dir, tok):
    from liveloop.learner.config import GRPOConfig

    _reply(store, "good0", _free(0), reward=0, group="g")
    _reply(store, "poison", _poison(tok), grammar=_tag(schema=NOTHING), group="g")
    _reply(store, "good1", _free(1), group="g")
    sw = OnlineLearner.resume(
        _cfg(tmp_path, method="sliding_window", batch_size=2), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert sw.step() and sw.state.samples == 2 and sw.state.pending_cursor == 3
    assert sw.status().lanes[0].metrics["learner/skipped_samples"] == 1.0
    grpo = OnlineLearner.resume(
        _cfg(tmp_path / "g", method="grpo", cursor_name="grpo", grpo=GRPOConfig(group_size=2)), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert grpo.step() and grpo.state.samples == 2  # the group is the two good replies: the poison never joins it
    assert grpo.status().lanes[0].metrics["learner/skipped_samples_grammar"] == 1.0
