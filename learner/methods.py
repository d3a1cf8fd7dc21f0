"""Learning methods the online learner can run (`[learner] method`): SAO and its baselines.

A method decides three things and nothing else (the loop, publishing and rollbacks stay in
`online.OnlineLearner`):
  1. which rated responses form the next batch (`next_batch`): SAO and the sliding window take the
     next B in arrival order, or with adaptive batching (`max_batch_size` M) every waiting one up to M
     (one waiting: a step of one when B = 1); GRPO waits until G responses to the same prompt are rated;
  2. the token advantages (and value targets, for a method with a critic) (`advantages`);
  3. the policy loss (`policy_loss`): SAO's two-sided mask or PPO's clip.

| method          | batch                       | advantage                       | loss             | critic |
|-----------------|-----------------------------|---------------------------------|------------------|--------|
| sao             | next B..M, arrival order    | GAE over action tokens          | two-sided mask   | yes    |
| sliding_window  | next B..M, arrival order    | r - mean(last W rewards)        | two-sided mask   | no     |
| grpo            | a complete group of G       | (r - mean_G) / std_G            | PPO clip (eps)   | no     |
| grpo_dis        | a complete group of G       | (r - mean_G) / std_G            | two-sided mask   | no     |

SAO's advantage levers (`[learner] baseline`, `advantage_norm`), the influence caps SAO and the sliding
window apply (learner/influence.py) and what a GRPO group is: the `SAO` and `GRPO` class docstrings.

The math lives in the RL core (`rl/advantages.py`, `rl/losses.py`); GRPO's group normalisation is the
one BGPO uses too (unbiased std, an all-equal group gets A = 0).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Protocol

import torch
from torch import Tensor

from liveloop.learner.config import LearnerConfig
from liveloop.learner.episodes import RatedFeed
from liveloop.learner.influence import InfluenceCaps, InfluenceLimits, KeyedRating
from liveloop.rl.advantages import (
    RunningMean, constant_baseline_gae, gae_skip_observations, group_normalized_advantages, length_adaptive_lambda,
    normalize_by_running_rms, running_mean_baselines, sliding_window_advantage,
)
from liveloop.rl.batch import Sample, TokenBatch
from liveloop.rl.losses import ppo_clip_loss, sao_policy_loss, staleness_metrics
from liveloop.store.records import StoredResponse


class Method(Protocol):
    name: str
    uses_critic: bool

    def next_batch(self, feed: RatedFeed, after_id: int, most: int | None = None) -> tuple[list[Sample], int] | None:
        """The next samples and the last feedback id they consume through; None: not yet. `feed` reads
        ratings (`rated_after`) and makes each one's sample (`sample`): learner/episodes.py `RatedFeed`.
        `most`: at most that many samples, where the method can split its batches (after a step ran out
        of memory: learner/memory.py)."""

    def passed(self, after_id: int) -> int:
        """How far past `after_id` the last `next_batch` (which said "not yet") read ratings that train
        nothing and are consumed (capped, or unscorable: learner/episodes.py); `after_id` if none."""

    def advantages(self, batch: TokenBatch, values: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Token advantages [B, W] and value targets [B, W] (None without a critic)."""

    def policy_loss(self, logprobs: Tensor, batch: TokenBatch, advantages: Tensor, staleness: Tensor) -> tuple[Tensor, dict[str, float]]: ...

    def reset(self) -> None:
        """Forget buffered state (after a rollback reloads another version)."""

    def retake(self) -> None:
        """The last batch's step failed (out of memory: learner/memory.py): offer its ratings again."""

    def stats(self) -> dict[str, float]:
        """Cumulative method metrics, merged into the learner's metrics."""


def _broadcast(per_sample: Tensor, action_mask: Tensor) -> Tensor:
    """A scalar advantage per sample [B] on every action token [B, W]."""
    return per_sample[:, None].to(action_mask.dtype) * action_mask


class SAO:
    """SAO: the next B..M ratings in arrival order, GAE over action tokens, the two-sided mask.

    Advantage levers (off by default, SAO only: the config refuses them for the baselines): `baseline =
    "running_mean"` gives every token the value "running mean of this learner's earlier rewards" in GAE
    instead of the critic's (which still trains on the same targets); `advantage_norm = "running"`
    divides each sample's advantages by the running RMS of recent ones. Their state lives in this
    object, so each learner (each lane) has its own; a rollback's reload and a restart start it afresh.
    Metrics: `learner/baseline`, `learner/advantage_scale` (the last batch's mean).

    Influence caps (SAO and the sliding window; the GRPO baselines have none, their batches are whole
    groups): at most `max_per_key_per_batch` samples of one API key per policy step (a rating past it
    ends the step and opens the next one: deferred, not dropped) and `max_per_key_per_window` per key
    in any `influence_window_seconds`. Ratings over the window cap are skipped (counted in
    `learner/capped_ratings`): the batch is filled from the ratings after them, and the cursor moves
    past them with the next batch. When every rating available is capped, `next_batch` says "not yet"
    and remembers how far it scanned, so the next call starts after them (nothing is trained twice,
    nothing capped is trained later)."""

    name, uses_critic = "sao", True
    scan_page = 64  # ratings read per store query once some were capped
    scan_limit = 1024  # most ratings examined by one call

    def __init__(self, config: LearnerConfig):
        self.config = config
        self.caps = InfluenceCaps(InfluenceLimits.from_config(config))
        self._skipped: tuple[int, int] | None = None  # (after_id, through): all capped and counted
        self._reset_levers()

    def _reset_levers(self) -> None:
        """The advantage levers' running state (`baseline` running_mean, `advantage_norm` running): fresh."""
        self.reward_mean = RunningMean()  # baseline running_mean: this learner's (lane's) rewards
        self.advantage_ms = RunningMean()  # advantage_norm running: mean squared action-token advantage
        self.levers: dict[str, float] = {}  # the last batch's learner/baseline and learner/advantage_scale

    def next_batch(self, feed: RatedFeed, after_id: int, most: int | None = None) -> tuple[list[Sample], int] | None:
        """The next ratings in arrival order that are within the influence caps: at least B of them,
        and with adaptive batching (`max_batch_size` M > B) as many of those waiting as fit, up to M
        (both at most `most`)."""
        B, M = self.config.batch_size, self.config.largest_batch
        if most is not None:
            B, M = min(B, most), min(M, most)
        self.caps.forget_after(after_id)
        start = self._skipped[1] if self._skipped and self._skipped[0] == after_id else after_id
        plan, taken, through, examined, end, cut = self.caps.plan(), [], start, 0, False, False
        while len(taken) < M and examined < self.scan_limit and not end and not cut:
            want = M - len(taken)
            size = min(want if not plan.capped else max(want, self.scan_page), self.scan_limit - examined)
            rated = feed.rated_after(through, size)
            end = len(rated) < size
            keys = [f.api_key_id for f, _ in rated]
            for i, (f, r) in enumerate(rated):
                others_wait = any(k != f.api_key_id for k in keys[i + 1:])  # another key's rating behind this one
                if plan.full_for(f.api_key_id, others_wait):  # the step has this key's share: it ends here, the rating opens the next
                    cut = True
                    break
                examined, through = examined + 1, f.id
                sample = feed.sample(f, r)  # None: it trains nothing (a broken or too long episode: counted there)
                if sample is not None and plan.offer(KeyedRating(f.id, f.api_key_id, f.created_at.timestamp()), others_wait):
                    taken.append(sample)
                    if len(taken) == M:
                        break
        if len(taken) >= B or (taken and (cut or not end)):  # enough, a step cut at a key's share, or the scan limit
            self.caps.commit(plan)
            self._skipped = None
            return taken, through
        if not taken and through > start:  # everything there was capped: count it, scan past it next time
            self.caps.commit(plan)
            self._skipped = (after_id, through)
        return None

    def passed(self, after_id: int) -> int:
        """The ratings a "not yet" scanned past `after_id` (all capped or unscorable): consumed."""
        return self._skipped[1] if self._skipped and self._skipped[0] == after_id else after_id

    def advantages(self, batch: TokenBatch, values: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """GAE per sample against the critic's values (`baseline` critic) or the running mean of earlier
        rewards (`baseline` running_mean; the critic's value targets are the same either way, so it keeps
        training), then with `advantage_norm` running divided by the running RMS scale."""
        c = self.config
        assert values is not None, "SAO needs the critic's values"
        advantages = torch.zeros_like(values)
        returns = torch.zeros_like(values)
        rewards = [float(r) for r in batch.rewards.tolist()]
        baselines = None
        if c.baseline == "running_mean":
            baselines, self.reward_mean = running_mean_baselines(rewards, self.reward_mean, c.baseline_horizon)
            self.levers["learner/baseline"] = sum(baselines) / len(baselines)
        for b in range(values.shape[0]):
            mask, reward = batch.action_mask[b], rewards[b]
            lam = length_adaptive_lambda(int(mask.sum()), c.lambda_alpha)
            if baselines is None:
                advantages[b], _ = gae_skip_observations(values[b], reward, mask, c.gamma, lam)
            else:
                advantages[b] = constant_baseline_gae(baselines[b], reward, mask, c.gamma, lam)
            _, returns[b] = gae_skip_observations(values[b], reward, mask, c.gamma, c.lambda_value)
        if c.advantage_norm == "running":
            advantages, scales, self.advantage_ms = normalize_by_running_rms(
                advantages, batch.action_mask, self.advantage_ms, c.advantage_norm_horizon, c.advantage_norm_floor
            )
            self.levers["learner/advantage_scale"] = sum(scales) / len(scales)
        return advantages, returns

    def policy_loss(self, logprobs: Tensor, batch: TokenBatch, advantages: Tensor, staleness: Tensor) -> tuple[Tensor, dict[str, float]]:
        c = self.config
        return sao_policy_loss(logprobs, batch.behavior_logprobs, advantages, batch.action_mask, c.eps_low, c.eps_high, staleness)

    def reset(self) -> None:
        self._skipped = None
        self._reset_levers()

    def retake(self) -> None:
        """Nothing to do: the next batch is read from the cursor, which the failed step did not move, and
        the influence caps forget what was committed past it (`InfluenceCaps.forget_after`)."""

    def stats(self) -> dict[str, float]:
        return self.caps.stats() | self.levers


class SlidingWindow(SAO):
    """No critic: A = r - mean(last W rewards before this one), the same on every action token."""

    name, uses_critic = "sliding_window", False

    def __init__(self, config: LearnerConfig):
        super().__init__(config)
        self.history: deque[float] = deque(maxlen=config.sliding_window.window)

    def advantages(self, batch: TokenBatch, values: Tensor | None) -> tuple[Tensor, Tensor | None]:
        per_sample = []
        for r in batch.rewards.tolist():
            a, _ = sliding_window_advantage(r, torch.tensor(list(self.history)))
            per_sample.append(a)
            self.history.append(r)
        return _broadcast(torch.tensor(per_sample), batch.action_mask), None

    def reset(self) -> None:
        super().reset()
        self.history.clear()

    def stats(self) -> dict[str, float]:
        h = self.history
        return super().stats() | {"learner/window_baseline": sum(h) / len(h) if h else 0.0, "learner/window_fill": float(len(h))}


class GRPO(SAO):
    """Waits for G rated responses to the same prompt; A = (r - mean_G) / std_G; PPO clip against the
    behavior logprobs (the policy that served them).

    A group is the responses whose request metadata share a `group` tag (simulated users tag the G
    requests of one prompt), else those with identical prompt token ids. Its wait (first to last rating
    of the group, by the store's feedback times) is measured. Ratings of a group still incomplete when
    the learner publishes are past the cursor: a restart drops them (baselines only; SAO loses nothing)."""

    name, uses_critic = "grpo", False
    read_batch = 256  # ratings read from the store per poll

    def __init__(self, config: LearnerConfig):
        super().__init__(config)
        self.reset()

    def retake(self) -> None:
        """The group that failed left the buffer: read everything past the cursor again."""
        self.reset()

    def reset(self) -> None:
        self.read_through = -1  # last feedback id read into the buffer
        self.buffer: OrderedDict[Hashable, list[tuple[Sample, float]]] = OrderedDict()  # group key -> (sample, feedback time)
        self.first_seen: dict[Hashable, float] = {}
        self.waits: list[float] = []
        self.groups = 0

    @staticmethod
    def group_key(response: StoredResponse) -> Hashable:
        tag = (response.request_meta or {}).get("group")
        return ("tag", tag) if tag else ("prompt", tuple(int(x) for x in response.prompt_ids))

    def next_batch(self, feed: RatedFeed, after_id: int, most: int | None = None) -> tuple[list[Sample], int] | None:
        """The oldest complete group (a group is not split: `most` is not heeded)."""
        G = self.config.grpo.group_size
        self.read_through = max(self.read_through, after_id)
        # read everything new into the buffer, by group
        while True:
            rated = feed.rated_after(self.read_through, self.read_batch)
            for f, r in rated:
                sample = feed.sample(f, r)
                if sample is None:
                    self.read_through = f.id
                    continue
                key = self.group_key(r)
                # buffered without its grammar's masks (they can be megabytes; the step replays them again)
                sample = dataclasses.replace(sample, masks=None)
                self.buffer.setdefault(key, []).append((sample, f.created_at.timestamp()))
                self.first_seen.setdefault(key, time.monotonic())
                self.read_through = f.id
            if len(rated) < self.read_batch:
                break
        # the oldest complete group
        for key, members in self.buffer.items():
            if len(members) >= G:
                group, rest = members[:G], members[G:]
                if rest:
                    self.buffer[key] = rest
                else:
                    del self.buffer[key]
                    self.first_seen.pop(key, None)
                times = [t for _, t in group]
                self.waits.append(max(times) - min(times))
                self.groups += 1
                return [s for s, _ in group], self.read_through
        return None

    def advantages(self, batch: TokenBatch, values: Tensor | None) -> tuple[Tensor, Tensor | None]:
        adv = group_normalized_advantages(batch.rewards[None])[0]  # the batch is one group
        return _broadcast(adv, batch.action_mask), None

    def policy_loss(self, logprobs: Tensor, batch: TokenBatch, advantages: Tensor, staleness: Tensor) -> tuple[Tensor, dict[str, float]]:
        loss, metrics = ppo_clip_loss(logprobs, batch.behavior_logprobs, advantages, batch.action_mask, self.config.grpo.clip_eps)
        return loss, metrics | staleness_metrics(staleness, batch.action_mask)

    def stats(self) -> dict[str, float]:
        w = self.waits
        return {
            "learner/groups": float(self.groups),
            "learner/groups_pending": float(len(self.buffer)),
            "learner/group_wait_seconds": w[-1] if w else 0.0,
            "learner/group_wait_mean_seconds": sum(w) / len(w) if w else 0.0,
            "learner/group_wait_max_seconds": max(w) if w else 0.0,
        }


class GRPODis(GRPO):
    """GRPO's groups and advantages with SAO's two-sided mask instead of the clip."""

    name = "grpo_dis"

    def policy_loss(self, logprobs: Tensor, batch: TokenBatch, advantages: Tensor, staleness: Tensor) -> tuple[Tensor, dict[str, float]]:
        return SAO.policy_loss(self, logprobs, batch, advantages, staleness)


METHODS: dict[str, type] = {"sao": SAO, "sliding_window": SlidingWindow, "grpo": GRPO, "grpo_dis": GRPODis}


def make_method(config: LearnerConfig) -> Method:
    """The method `[learner] method` names (the config loader accepts only these names)."""
    if config.method not in METHODS:
        raise ValueError(f"learner.method: expected one of {list(METHODS)}, got {config.method!r}")
    return METHODS[config.method](config)
