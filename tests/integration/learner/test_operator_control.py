"""The learner follows the operator through the store: paused it neither trains nor publishes; after
a rollback it reloads the target version, and a publish that races the rollback is refused; an
operator's publish (`POST /admin/weights`) becomes its lineage the same way."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.devtools import perturbed_checkpoint
from liveloop.learner.online import OnlineLearner
from liveloop.store import VersionStatus


def _learner(store, tmp_path, model_dir) -> OnlineLearner:
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=2, publish_every_seconds=3600, poll_seconds=0.01)
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def _weights(path: str) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_paused_learner_neither_trains_nor_publishes(rate, store, tmp_path, model_dir):
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir)
    store.operator.set_learning_paused("sao", True)
    polls = iter(range(20))
    learner.run(lambda: next(polls, None) is None)  # 20 polls of the loop while paused
    assert learner.paused and learner.state.step == 0
    assert store.versions.versions_with_status("published") == [] and store.feedback.get_cursor("sao") == 0
    store.operator.set_learning_paused("sao", False)
    learner.run(lambda: False, max_steps=4)
    assert not learner.paused
    assert [v.version for v in store.versions.versions_with_status("published")] == [1, 2]


def test_rollback_reloads_and_a_racing_publish_is_refused(rate, store, tmp_path, model_dir):
    rate(store, 8)
    learner = _learner(store, tmp_path, model_dir)
    for _ in range(4):
        learner.step()  # publishes v1 (after 2 steps) and v2 (after 4)
    assert learner.state.version == 2
    store.versions.rollback_to(1, "sao", reason="test")
    # the learner has not looked yet: its next publish (on top of v2) is refused, and it reloads v1
    learner.step()
    learner.step()
    assert store.versions.get_version(3) is None
    assert learner.state.version == 1 and learner.state.cursor == 4
    v1 = _weights(store.versions.get_version(1).checkpoint_path)
    assert all(torch.equal(v1[k], v) for k, v in learner.policy.state_dict().items())
    # it carries on from v1: the next version's parent is 1; versions 2 stays rolled back
    learner.run(lambda: False, max_steps=learner.state.step + 2)
    newest = store.versions.list_versions()[-1]
    assert (newest.version, newest.parent, store.versions.get_version(2).status) == (3, 1, "rolled_back")


def test_rollback_is_followed_between_steps(rate, store, tmp_path, model_dir):
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir)
    learner.run(lambda: False, max_steps=2)  # v1
    store.versions.rollback_to(0, "sao")
    assert not learner.sync_with_store()
    assert learner.state.version == 0
    base = _weights(str(model_dir))
    assert all(torch.equal(base[k], v) for k, v in learner.policy.state_dict().items())


def test_an_operator_publish_becomes_the_lineage_and_a_racing_publish_is_refused(rate, store, tmp_path, model_dir):
    rate(store, 8)
    learner = _learner(store, tmp_path, model_dir)
    learner.step()
    learner.step()  # v1
    store.versions.activate_version(1)
    learner.step()  # one step on top of v1, not published yet
    # the operator swaps its own checkpoint in: what the publisher has the store do around the engine swap
    ckpt = perturbed_checkpoint(model_dir, tmp_path / "operator", seed=7)
    op = store.versions.add_version(None, parent=1, checkpoint_path=str(ckpt), status=VersionStatus.LOADING).version
    store.versions.activate_version(op, cursor_name="sao")
    learner.step()  # its publish on v1 is refused: it reloads the operator's version
    assert [v.version for v in store.versions.list_versions()] == [0, 1, op] and learner.state.version == op
    expected = _weights(str(ckpt))
    assert all(torch.equal(expected[k], v) for k, v in learner.policy.state_dict().items())
    learner.run(lambda: False, max_steps=learner.state.step + 2)
    newest = store.versions.list_versions()[-1]
    assert (newest.version, newest.parent) == (op + 1, op)
    assert not list((tmp_path / "versions").glob(".staging-*"))  # nothing left behind
