"""Per-segment adapters in the learner, on a real SQLite store and the tiny model through peft: each
segment's lane trains only on its own segment's ratings, publishes adapter versions of its segment,
never moves the base or another segment's adapter, and follows a rollback of its own lineage only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from liveloop.config_types import ConfigError
from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig, LoraSettings
from liveloop.learner.lanes import SegmentLanes, build_learner
from liveloop.learner.online import OnlineLearner
from liveloop.segments import OVERFLOW, Lineage, SegmentsConfig, segment_of
from liveloop.store import FeedbackRecord, ResponseRecord, Store, VersionStatus


SEGMENTS = SegmentsConfig(adapters="segment", names=("cozy", "night"))


def _config(tmp_path, **kw) -> LearnerConfig:
    base = dict(
        publish_every_steps=2, publish_every_seconds=3600,
        learning_rate=1e-3, checkpoint_dir=str(tmp_path / "versions"), poll_seconds=0.01, lora=LoraSettings(rank=4, alpha=8),
    )
    return LearnerConfig(**(base | kw))


def _rate(store: Store, segment: str | None, n: int, start: int, reward: int | None = None) -> None:
    """n rated responses served to `segment` (rewards alternate unless given)."""
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        rec = ResponseRecord(
            f"r{i}", "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)),
            tuple(int(x) for x in rng.integers(5, 500, 8)), (-2.0,) * 8, "stop", 1.0, 1.0, 1.0, segment=segment,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", i % 2 if reward is None else reward))


def _state(module: torch.nn.Module, marker: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if marker in n}


def test_routing_is_bounded_by_the_operators_list():
    assert segment_of({"segment": "cozy"}, SEGMENTS) == "cozy"
    assert segment_of({"segment": "evil-" * 20}, SEGMENTS) == OVERFLOW
    assert segment_of(None, SEGMENTS) == OVERFLOW and segment_of({"segment": 3}, SEGMENTS) == OVERFLOW
    assert segment_of({"segment": "cozy"}, SegmentsConfig(adapters="shared")) == "shared"
    assert segment_of({"segment": "cozy"}, SegmentsConfig(adapters="none")) is None


def test_each_lane_trains_only_on_its_segment(store, tmp_path):
    _rate(store, "cozy", 4, 0)
    _rate(store, "night", 2, 100)
    _rate(store, "cozy", 2, 200)
    learner = build_learner(
        _config(tmp_path), CriticConfig(), store.versions.get_version(0).checkpoint_path, segments=SEGMENTS,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert isinstance(learner, SegmentLanes)
    policy = learner.adapters.model
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    overflow_before = _state(policy, f".{OVERFLOW}.")
    learner.run(lambda: False, max_steps=8)
    cozy, night, overflow = (learner.lanes[s] for s in ("cozy", "night", OVERFLOW))
    assert (cozy.state.samples, night.state.samples, overflow.state.samples) == (6, 2, 0)
    # versions of each segment, in their own lineage (the first one on the base version 0)
    by_segment: dict[str | None, list] = {}
    for r in store.versions.list_versions():
        by_segment.setdefault(r.segment, []).append(r)
    assert [r.version for r in by_segment[None]] == [0]
    assert len(by_segment["cozy"]) == 3 and len(by_segment["night"]) == 1 and OVERFLOW not in by_segment
    assert by_segment["cozy"][0].parent == 0 and by_segment["cozy"][1].parent == by_segment["cozy"][0].version
    assert by_segment["night"][0].parent == 0
    # a version's checkpoint is a peft adapter directory of its segment
    config = json.loads((tmp_path / "versions" / f"v{by_segment['night'][0].version:06d}" / "policy" / "adapter_config.json").read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    # the base never moves; the lane without ratings keeps its adapter as it was
    assert all(torch.equal(p, base_before[n]) for n, p in policy.named_parameters() if "lora_" not in n)
    assert all(torch.equal(p, overflow_before[n]) for n, p in _state(policy, f".{OVERFLOW}.").items())
    assert store.feedback.get_cursor("sao:cozy") > 0 and store.feedback.get_cursor("sao:overflow") == 0


def test_a_lane_resumes_from_its_adapter_and_follows_its_own_rollback(store, tmp_path):
    _rate(store, "cozy", 4, 0)
    _rate(store, "night", 2, 100)
    model_dir = store.versions.get_version(0).checkpoint_path
    first = SegmentLanes(
        _config(tmp_path), SEGMENTS, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    first.run(lambda: False, max_steps=6)
    cozy_versions = [r.version for r in store.versions.list_versions() if r.segment == "cozy"]
    night_version = store.versions.latest_version(VersionStatus.PUBLISHED, segment="night").version
    trained = _state(first.adapters.model, ".cozy.")
    # a restart loads each lane's last published adapter exactly
    second = SegmentLanes(
        _config(tmp_path), SEGMENTS, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert second.lanes["cozy"].state.version == cozy_versions[-1]
    reloaded = _state(second.adapters.model, ".cozy.")
    assert all(torch.equal(p, trained[n]) for n, p in reloaded.items())
    # rolling cozy back to the base: cozy's lane starts a fresh adapter, night's is untouched
    store.versions.rollback_to(0, "sao:cozy", segment="cozy")
    second.lanes["cozy"].sync_with_store()
    second.lanes["night"].sync_with_store()
    assert second.lanes["cozy"].state.version == 0 and second.lanes["night"].state.version == night_version
    fresh = _state(second.adapters.model, ".cozy.")
    assert all(float(p.abs().max()) == 0.0 for n, p in fresh.items() if "lora_B" in n)  # B = 0: the base exactly


def test_a_rollback_makes_the_restart_rule_judge_afresh(store, tmp_path):
    """With restart on, an operator's rollback of a lane clears its restart window: the ratings the rolled
    back adapter earned say nothing about the adapter serving now. Without that, cozy's best window (1, 1)
    and one down-vote after the rollback (1, 0) would read as a 0.5 drop and start the adapter over."""
    model_dir = store.versions.get_version(0).checkpoint_path
    config = _config(tmp_path, publish_every_steps=1, lora=LoraSettings(rank=4, alpha=8, restart_window=2, restart_drop=0.5))
    lanes = SegmentLanes(
        config, SEGMENTS, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    cozy = lanes.lanes["cozy"]
    _rate(store, "cozy", 2, 0, reward=1)
    lanes.run(lambda: False, max_steps=2)
    assert (cozy.restart.best, cozy.restart.window_mean, cozy.state.samples) == (1.0, 1.0, 2)
    store.versions.rollback_to(0, "sao:cozy", segment="cozy")
    cozy.sync_with_store()
    assert cozy.state.version == 0 and (cozy.restart.best, cozy.restart.window_mean) == (None, None)
    _rate(store, "cozy", 1, 10, reward=0)
    lanes.run(lambda: False, max_steps=3)  # steps in all, counted from the start
    assert cozy.state.samples == 3 and cozy.restart.restarts == 0


def test_kl_reference_is_the_base_without_adapters(store, tmp_path):
    _rate(store, "cozy", 2, 0, reward=1)
    model_dir = store.versions.get_version(0).checkpoint_path
    lanes = SegmentLanes(
        _config(tmp_path, kl_coef=0.1, kl_estimator="exact"), SEGMENTS, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    lanes.run(lambda: False, max_steps=2)
    metrics = lanes.lanes["cozy"].state.last_metrics
    # the first step starts from a fresh adapter (= the base): its KL to the base is ~0, then it moves
    assert "learner/kl" in metrics and np.isfinite(metrics["learner/kl"])
    assert lanes.lanes["cozy"].reference is None  # no second copy of the base


def test_shared_adapter_trains_on_every_rating(store, tmp_path):
    _rate(store, "shared", 3, 0)
    learner = build_learner(
        _config(tmp_path), CriticConfig(), store.versions.get_version(0).checkpoint_path, segments=SegmentsConfig(adapters="shared"),
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=3)
    assert list(learner.lanes) == ["shared"] and learner.lanes["shared"].state.samples == 3
    assert {r.segment for r in store.versions.list_versions()} == {None, "shared"}


def test_the_plain_learner_is_unchanged(store, tmp_path):
    learner = build_learner(
        _config(tmp_path), CriticConfig(), store.versions.get_version(0).checkpoint_path, segments=SegmentsConfig(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert isinstance(learner, OnlineLearner) and learner.segment is None and learner.cursor_name == "sao"


def test_adapters_need_zero_stage_0(tmp_path):
    """`[segments]` adapters train on one process's whole parameters: a ZeRO learner is refused before any load."""
    with pytest.raises(ConfigError, match="segments.adapters = 'segment' needs learner.zero_stage 0"):
        SegmentLanes(_config(tmp_path, zero_stage=1), SEGMENTS, CriticConfig(), tmp_path,
                     feedback=None, versions=None, operator=None, episodes=None)  # type: ignore[arg-type]


def test_targets_the_engines_cannot_serve_are_refused_at_start(store, tmp_path):
    from liveloop.learner.adapters import UnadaptableTargets

    model_dir = store.versions.get_version(0).checkpoint_path
    for targets, message in ((("q_proj", "gate"), "Qwen3MoeTopKRouter"), (("q_proj", "nope"), "nope")):
        config = _config(tmp_path, lora=LoraSettings(rank=4, alpha=8, target_modules=targets))
        with pytest.raises(UnadaptableTargets, match=message):
            SegmentLanes(
                config, SEGMENTS, CriticConfig(), model_dir,
                feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
            )


def test_one_loop_runs_the_lanes_a_paused_one_is_skipped_and_the_status_is_typed(store, tmp_path):
    """The loop a plain learner runs (learner/loop.py) offers every lane a step in turn: a paused lane
    neither trains nor publishes while the others do, and the status has a lane per segment."""
    _rate(store, "cozy", 2, 0)
    _rate(store, "night", 2, 100)
    store.operator.set_learning_paused("sao:night", True)
    learner = SegmentLanes(
        _config(tmp_path), SEGMENTS, CriticConfig(), store.versions.get_version(0).checkpoint_path,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=2)
    status = learner.status()
    assert [lane.segment for lane in status.lanes] == list(learner.lanes)
    cozy, night = status.lane(Lineage("cozy")), status.lane(Lineage("night"))
    assert (cozy.step, cozy.samples, cozy.paused) == (2, 2, False) and (night.step, night.paused) == (0, True)
    assert status.step == 2 and not status.paused and status.version is None
    assert cozy.version == store.versions.cursor_version("sao:cozy") > 0 and night.version == 0  # cozy published at its 2nd step
    assert status.as_dict()["segments"]["cozy"]["pending_cursor"] == cozy.pending_cursor == store.feedback.get_cursor("sao:cozy")


def test_an_adapters_rate_ceiling_is_its_own_and_the_whole_policy_keeps_the_learners(store, tmp_path):
    model_dir = store.versions.get_version(0).checkpoint_path
    steps = dict(target_step_kl=0.005, min_learning_rate=1e-5, max_learning_rate=2e-3)
    lanes = SegmentLanes(
        _config(tmp_path, lora=LoraSettings(rank=4, alpha=8, max_learning_rate=2e-2), **steps), SEGMENTS, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert {lane.step_size.max_lr for lane in lanes.lanes.values()} == {2e-2}
    whole = build_learner(
        _config(tmp_path, lora=LoraSettings(max_learning_rate=2e-2), **steps), CriticConfig(), model_dir, segments=SegmentsConfig(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert whole.step_size.max_lr == 2e-3
    assert _config(tmp_path, **steps).adapter_max_learning_rate == 2e-3  # unset: the learner's
    with pytest.raises(ValueError, match="lora.max_learning_rate"):
        _config(tmp_path, lora=LoraSettings(max_learning_rate=1e-4), **steps)
    with pytest.raises(ValueError, match="lora max_learning_rate"):
        LoraSettings(max_learning_rate=-1.0)
