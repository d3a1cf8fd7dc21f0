"""The baselines' batch selection and advantages (learner/methods.py) on tiny hand-made samples and an
in-memory stand-in for the store's `rated_after`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from liveloop.config import ConfigError, load_section
from liveloop.learner.config import GRPOConfig, LearnerConfig, SlidingWindowConfig
from liveloop.learner.episodes import EpisodeSamples
from liveloop.learner.methods import GRPO, SAO, GRPODis, SlidingWindow, make_method
from liveloop.rl.batch import make_batch


@dataclass
class _Feedback:
    id: int
    reward: int
    created_at: datetime
    api_key_id: str = "k"


@dataclass
class _Response:
    prompt_ids: tuple
    response_ids: np.ndarray = field(default_factory=lambda: np.array([5, 6, 7]))
    behavior_logprobs: np.ndarray = field(default_factory=lambda: np.full(3, -1.0, np.float32))
    action_mask: np.ndarray = field(default_factory=lambda: np.ones(3, np.uint8))
    policy_version: int = 0
    request_meta: dict | None = None


class _Store:
    def __init__(self):
        self.rows = []

    def add(self, prompt, reward, t, group=None):
        fid = len(self.rows) + 1
        meta = {"group": group} if group else None
        self.rows.append((_Feedback(fid, reward, datetime.fromtimestamp(t, timezone.utc)), _Response(tuple(prompt), request_meta=meta)))

    def rated_after(self, after, n):
        return [row for row in self.rows if row[0].id > after][:n]

    def sample(self, f, r):  # what the learner's reader makes of a lone response
        return EpisodeSamples(self, None, 0).sample(f, r)


def test_make_method_and_config_validation():
    assert isinstance(make_method(LearnerConfig()), SAO)
    assert isinstance(make_method(LearnerConfig(method="sliding_window")), SlidingWindow)
    assert isinstance(make_method(LearnerConfig(method="grpo")), GRPO)
    assert isinstance(make_method(LearnerConfig(method="grpo_dis")), GRPODis)
    with pytest.raises(ConfigError, match=r"learner\.method: expected one of \['sao', 'sliding_window', 'grpo', 'grpo_dis'\]"):
        load_section(LearnerConfig, {"method": "ppo"}, "learner")
    assert load_section(LearnerConfig, {"method": "grpo"}, "learner").method == "grpo"
    with pytest.raises(ValueError, match="method must be one of"):
        LearnerConfig(method="ppo")  # built without the loader: the same Literal is checked
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(group_size=1)
    nested = load_section(LearnerConfig, {"method": "grpo", "grpo": {"group_size": 3}}, "learner")
    assert nested.grpo == GRPOConfig(group_size=3, clip_eps=0.2) and nested.sliding_window == SlidingWindowConfig()
    with pytest.raises(ConfigError, match=r"learner\.grpo\.group_size: expected int"):
        load_section(LearnerConfig, {"grpo": {"group_size": "4"}}, "learner")


def test_sliding_window_advantage_uses_the_last_w_rewards_before_each_sample():
    m = SlidingWindow(LearnerConfig(method="sliding_window", sliding_window=SlidingWindowConfig(window=2), batch_size=4, max_per_key_per_batch=4))
    store = _Store()
    for r in (1, 0, 1, 1):
        store.add([1, 2], r, 0.0)
    samples, last = m.next_batch(store, 0)
    assert last == 4 and len(samples) == 4
    batch = make_batch(samples)
    adv, returns = m.advantages(batch, None)
    assert returns is None
    # baselines: [] -> 0, [1] -> 1, [1, 0] -> 0.5, [0, 1] -> 0.5 (window 2)
    # A = r - baseline: [1 - 0, 0 - 1, 1 - 0.5, 1 - 0.5] = [1, -1, 0.5, 0.5], on every action token
    assert adv.tolist() == [[1.0] * 3, [-1.0] * 3, [0.5] * 3, [0.5] * 3]
    assert m.stats()["learner/window_baseline"] == 1.0  # window now [1, 1]
    m.reset()
    assert m.stats()["learner/window_fill"] == 0.0


def test_sliding_window_waits_for_a_full_batch():
    m = SlidingWindow(LearnerConfig(method="sliding_window", batch_size=2))
    store = _Store()
    store.add([1], 1, 0.0)
    assert m.next_batch(store, 0) is None


def _keys(n: int) -> _Store:
    """n ratings from n different keys (the per-key cap never ends a step)."""
    store = _Store()
    for i in range(n):
        store.add([1, i], i % 2, float(i))
        store.rows[-1][0].api_key_id = f"k{i}"
    return store


def test_adaptive_batch_takes_one_when_one_waits_and_up_to_the_max_when_many_wait():
    m = SAO(LearnerConfig(max_batch_size=4))
    one = _keys(1)
    samples, last = m.next_batch(one, 0)
    assert (len(samples), last) == (1, 1)  # no waiting for more
    queue = _keys(10)
    steps = []
    after = 0
    while (taken := m.next_batch(queue, after)) is not None:
        samples, after = taken
        steps.append(len(samples))
    assert steps == [4, 4, 2] and after == 10  # a queue of 10 in steps of at most M, in arrival order
    # each sample keeps its own reward: no grouping by prompt
    samples, _ = SAO(LearnerConfig(max_batch_size=16)).next_batch(queue, 0)
    assert [float(s.reward) for s in samples] == [i % 2 for i in range(10)]


def test_adaptive_batch_still_waits_for_the_minimum_b():
    m = SAO(LearnerConfig(batch_size=3, max_batch_size=8))
    assert m.next_batch(_keys(2), 0) is None
    samples, last = m.next_batch(_keys(5), 0)
    assert (len(samples), last) == (5, 5)
    with pytest.raises(ValueError, match="max_batch_size"):
        LearnerConfig(batch_size=4, max_batch_size=2)


def test_grpo_waits_for_a_complete_group_and_measures_the_wait():
    m = GRPO(LearnerConfig(method="grpo", grpo=GRPOConfig(group_size=3)))
    store = _Store()
    store.add([1, 2], 1, 10.0, group="a")
    store.add([1, 2], 0, 11.0, group="b")  # same prompt, another group tag: not mixed with "a"
    store.add([1, 2], 0, 12.0, group="a")
    assert m.next_batch(store, 0) is None  # "a" has 2 of 3
    assert m.stats()["learner/groups_pending"] == 2.0
    store.add([9], 1, 13.0)  # untagged: grouped by prompt ids
    store.add([1, 2], 1, 14.5, group="a")
    samples, last = m.next_batch(store, 0)
    assert last == 5 and [s.reward for s in samples] == [1.0, 0.0, 1.0]
    stats = m.stats()
    assert stats["learner/group_wait_seconds"] == pytest.approx(4.5)  # 14.5 - 10.0
    assert stats["learner/groups"] == 1.0 and stats["learner/groups_pending"] == 2.0
    # rewards [1, 0, 1]: mean 2/3, unbiased std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3) = 0.57735;
    # A = [(1/3) / 0.57735, -(2/3) / 0.57735, (1/3) / 0.57735] = [0.57735, -1.15470, 0.57735]
    adv, returns = m.advantages(make_batch(samples), None)
    assert returns is None
    assert adv[:, 0].tolist() == pytest.approx([0.57735, -1.15470, 0.57735], abs=1e-4)
    assert m.next_batch(store, 5) is None
    store.add([9], 0, 15.0)
    store.add([9], 0, 16.0)
    samples, _ = m.next_batch(store, 5)
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]  # the untagged prompt [9]
    m.reset()
    assert m.stats()["learner/groups_pending"] == 0.0


def test_grpo_clips_and_grpo_dis_masks():
    store = _Store()
    for r in (1, 0):
        store.add([3], r, 0.0, group="g")
    cfg = dict(grpo=GRPOConfig(group_size=2, clip_eps=0.2), eps_low=0.3, eps_high=0.5)
    grpo, dis = GRPO(LearnerConfig(method="grpo", **cfg)), GRPODis(LearnerConfig(method="grpo_dis", **cfg))
    samples, _ = grpo.next_batch(store, 0)
    batch = make_batch(samples)
    adv, _ = grpo.advantages(batch, None)  # mean 0.5, unbiased std sqrt(0.5): [a, -a], a = 0.5 / sqrt(0.5) = sqrt(0.5)
    a = math.sqrt(0.5)
    # ratio 2 on every token (logprob -1 + ln 2 against behavior -1): above both bands
    lp = (batch.behavior_logprobs + np.log(2.0)).requires_grad_()
    loss, m = grpo.policy_loss(lp, batch, adv, torch.zeros(2))
    # PPO: A=+a tokens take min(2a, 1.2a) = 1.2a; A=-a tokens min(-2a, -1.2a) = -2a -> mean (1.2a - 2a)/2 = -0.4a, loss 0.4a
    assert loss.item() == pytest.approx(0.4 * a, abs=1e-5) and m["learner/clip_fraction"] == 1.0
    loss.backward()
    assert lp.grad[0].abs().sum() == 0 and lp.grad[1].abs().sum() > 0  # clipped side flat, the other not
    lp2 = (batch.behavior_logprobs + np.log(2.0)).requires_grad_()
    loss2, m2 = dis.policy_loss(lp2, batch, adv, torch.zeros(2))
    # two-sided mask (0.7, 1.5): ratio 2 is outside for both signs -> loss 0, no gradient at all
    assert loss2.item() == 0.0 and m2["learner/kept_fraction"] == 0.0
    loss2.backward()
    assert lp2.grad.abs().sum() == 0


def test_the_per_step_key_cap_defers_and_never_drops():
    """One key, batch size 4, at most 2 of its samples per step: steps of 2, every rating trained once."""
    store = _Store()
    for i in range(5):
        store.add([1, 2], i % 2, 100.0 + i)
    sao = make_method(LearnerConfig(batch_size=4, max_per_key_per_batch=2))
    cursor, steps = 0, []
    while (taken := sao.next_batch(store, cursor)) is not None:
        samples, cursor = taken
        steps.append(len(samples))
        if len(steps) > 10:
            break
    # 2 + 2, then the last one waits for a full batch of 4 (more of its key could still come)
    assert steps == [2, 2] and cursor == 4
    assert sao.stats()["learner/capped_ratings"] == 0.0


def _steps(store, config) -> list[list[str]]:
    """The keys of each step's samples, until nothing more is taken."""
    sao, cursor, steps = make_method(config), 0, []
    while (taken := sao.next_batch(store, cursor)) is not None and len(steps) < 20:
        samples, through = taken
        steps.append([f.api_key_id for f, _ in store.rows if cursor < f.id <= through])
        cursor = through
    return steps


def test_a_lone_key_fills_the_step_and_the_cap_binds_while_others_wait():
    """One rating per key per step (the shipped cap) while another key's rating waits behind; a key whose
    ratings are the only ones waiting fills the step (lone_key_batches), never past one step's size."""
    lone, shared = _Store(), _Store()
    for i in range(6):
        lone.add([1, 2], i % 2, 100.0 + i)
        shared.add([1, 2], i % 2, 100.0 + i)
    shared.rows[2][0].api_key_id = "other"  # k, k, other, k, k, k
    config = dict(batch_size=1, max_batch_size=4, max_per_key_per_batch=1)
    assert _steps(lone, LearnerConfig(**config)) == [["k"]] * 6  # the cap alone: batch 1 for a lone key
    assert _steps(lone, LearnerConfig(**config, lone_key_batches=True)) == [["k"] * 4, ["k"] * 2]
    # within the first step's reach the other key's rating waits behind k's: k has its one, the step ends there;
    # the next step holds the other key's and, with nobody else waiting behind them, k's up to the size
    assert _steps(shared, LearnerConfig(**config, lone_key_batches=True)) == [["k"], ["k", "other", "k", "k"], ["k"]]
    assert _steps(shared, LearnerConfig(**config)) == [["k"], ["k", "other"], ["k"], ["k"], ["k"]]
