"""The learner's step as it was before issue 36 (commit a4a7356), kept as the oracle the faster step is held to.

`ReferenceLearner` is an `OnlineLearner` whose step is that code, unchanged in what it computes and how:
the critic's values from their own no-grad forward and then K value steps each with its own forward, the
KL reference, the policy's and the step-KL forwards with the default KV cache, the trust region's "after"
snapshot and restore on every step and all three cut-backs measured eagerly, AdamW without `foreach`. The
step of online.py must produce the same weights, optimizer state, controllers and metrics bit for bit
(tests/integration/learner/test_step_equivalence.py); bench/learner_batch.py `--compare` times both in one
process. Nothing serves or trains with it. One process, zero_stage 0 only (what the comparison covers).

Its publishing is as it was too, for the benchmark's served-like arm: a version after every N steps
whatever waits (no coalescing), and an in-memory version's durable checkpoint written by a thread beside
the steps, at most two outstanding (`ThreadedDurablePublisher`).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from liveloop.critic.trainer import Critic
from liveloop.learner.online import OnlineLearner
from liveloop.learner.publishing import VersionPublisher
from liveloop.rl.batch import TokenBatch, make_batch, response_log_dists, token_logprobs
from liveloop.rl.control import CUT_BACKS, TrustRegionVerdict
from liveloop.rl.diagnostics import token_entropy, token_kl
from liveloop.rl.losses import exact_kl_penalty, kl_penalty, value_loss


def _plain_adamw(opt) -> None:
    """Give a fresh `TorchOptimizer` the AdamW it had before issue 36 (no `foreach`; no state yet)."""
    old = opt.optimizer
    opt.optimizer = torch.optim.AdamW(old.param_groups[0]["params"], lr=old.param_groups[0]["lr"], weight_decay=0.0)


def reference_trust_region(kl_at, full_kl: float, max_kl: float) -> TrustRegionVerdict:
    """rl.control.trust_region as it was: every cut-back measured before any is chosen."""
    if full_kl <= max_kl:
        return TrustRegionVerdict(1.0, "within", full_kl)
    measured = {scale: kl_at(scale) for scale in CUT_BACKS}
    for scale in CUT_BACKS:
        if measured[scale] <= max_kl:
            return TrustRegionVerdict(scale, "cut", measured[scale])
    small, next_up = CUT_BACKS[-1], CUT_BACKS[-2]
    if measured[small] > 0.5 * measured[next_up]:
        return TrustRegionVerdict(small, "jump", measured[small])
    return TrustRegionVerdict(0.0, "undone", 0.0)


def reference_token_values(model, input_ids, attention_mask, prompt_lengths: list[int], width: int) -> torch.Tensor:
    """critic.value_model.token_values as it was (the model's default KV cache)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0]
    rows = []
    for b, p in enumerate(prompt_lengths):
        seg = out[b, p - 1 : p - 1 + width]
        if seg.shape[0] < width:
            seg = torch.cat([seg, seg.new_zeros(width - seg.shape[0])])
        rows.append(seg)
    return torch.stack(rows)


@torch.no_grad()
def reference_critic_values(critic: Critic, batch: TokenBatch) -> torch.Tensor:
    """Critic.values as it was: its own no-grad forward in eval mode."""
    critic.model.eval()
    return reference_token_values(critic.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)


def reference_critic_update(critic: Critic, batch: TokenBatch, returns: torch.Tensor) -> dict[str, float]:
    """Critic.update as it was: K optimizer steps, each with its own forward."""
    critic.model.train()
    metrics: dict[str, float] = {}
    norms = []
    for _ in range(critic.config.value_steps):
        v = reference_token_values(critic.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)
        loss, metrics = value_loss(v.float(), returns, batch.action_mask)
        norm = critic.optimizer.step(loss)
        if norm is None:
            critic.skipped_steps += 1
        else:
            norms.append(norm)
    metrics["critic/grad_norm"] = max(norms) if norms else float("nan")
    metrics["critic/skipped_steps"] = float(critic.skipped_steps)
    return metrics


class ThreadedDurablePublisher(VersionPublisher):
    """The durable checkpoints of in-memory versions as before issue 36: one background thread writes them
    while the learner trains on, at most two outstanding."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durable-checkpoint")
        self._writes: deque[Future] = deque()

    def _defer_durable(self, *write) -> None:
        while len(self._writes) >= 2:
            self._writes.popleft().result()
        self._writes.append(self._thread.submit(self._write_durable, *write))

    def write_durable(self) -> bool:
        return False  # nothing waits for the learner: the thread writes

    def wait_durable(self) -> None:
        while self._writes:
            self._writes.popleft().result()


class ReferenceLearner(OnlineLearner):
    """An OnlineLearner stepping (and publishing) as before issue 36 (see the module docstring)."""

    publisher = ThreadedDurablePublisher

    def _optimizer(self, policy_dir):
        opt = super()._optimizer(policy_dir)
        _plain_adamw(opt)
        return opt

    def _critic(self, backbone):
        critic = super()._critic(backbone)
        if critic is not None:
            _plain_adamw(critic.optimizer)
        return critic

    def _reference_log_dists(self, batch):
        with torch.no_grad():
            if self.adapters is not None:
                with self.adapters.base() as base:
                    logits = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            else:
                logits = self.reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            return response_log_dists(logits, batch)

    def _step(self) -> bool:
        c, s = self.config, self.state
        taken = self.method.next_batch(self.ratings, s.pending_cursor)
        if taken is None:
            return False
        samples, last_id = taken
        started = time.perf_counter()
        host = make_batch(samples, grammars=self._grammars(samples))
        if c.episode_observations == "actions" and bool(torch.isnan(host.behavior_logprobs).any()):
            host = self._scored_on_policy(host)
        batch = self.place.batch(host)
        values = reference_critic_values(self.critic, batch).float() if self.critic is not None else None
        advantages, returns = self.method.advantages(host, values.cpu() if values is not None else None)
        advantages = advantages.to(self.place.device)
        returns = returns.to(self.place.device) if returns is not None else None
        metrics = reference_critic_update(self.critic, batch, returns) if self.critic is not None else {}
        metrics |= self._policy_step(batch, advantages)
        metrics |= self.method.stats() | self.ratings.stats() | self.window.add(host, values.cpu() if values is not None else None, advantages.cpu())
        if self.restart is not None:
            started_over = self.restart.add(host.rewards.tolist())
            metrics |= self.restart.stats()
            if started_over:
                self._start_over()
        s.pending_cursor = last_id
        s.step += 1
        s.samples += len(samples)
        s.steps_since_publish += 1
        s.samples_since_publish += len(samples)
        s.last_metrics = metrics | {"learner/reward_mean": float(host.rewards.mean()), "learner/batch_size": float(len(samples))}
        self.busy_seconds += time.perf_counter() - started
        if s.steps_since_publish >= c.publish_every_steps:
            self.publish()
        return True

    def _policy_step(self, batch, advantages):
        c = self.config
        self.policy.train()
        staleness = (self.state.version - batch.versions).clamp(min=0)
        ref = self._reference_log_dists(batch) if self.kl_anchored else None
        loss, dists, metrics = self._objective(batch, advantages, staleness, ref)
        metrics["learner/entropy"] = token_entropy(dists.detach(), batch.action_mask)
        before = self.policy_opt.snapshot() if c.max_step_kl > 0 else None
        norm = self.policy_opt.step(loss)
        metrics["learner/lr"], metrics["learner/kl_coef"] = self.learning_rate, self.kl_coef
        if norm is None:
            self.state.skipped_steps += 1
        else:
            metrics["learner/grad_norm"] = norm
            step_kl = self._step_kl(batch, dists.detach())
            verdict = self._trust_region(batch, dists.detach(), before, step_kl) if before is not None else None
            if self.step_size is not None and (verdict is None or verdict.kind != "jump"):
                moved = step_kl if verdict is None or verdict.kind == "undone" else verdict.kl
                self.policy_opt.set_lr(self.step_size.update(moved))
            metrics["learner/step_kl"] = verdict.kl if verdict is not None and verdict.scale > 0 else step_kl
            s = self.state
            s.rejected_steps += int(verdict is not None and verdict.kind == "undone")
            s.cut_steps += int(verdict is not None and verdict.kind == "cut")
            s.jumps += int(verdict is not None and verdict.kind == "jump")
            s.updates_since_publish += int(verdict is None or verdict.scale > 0)
        metrics["learner/rejected_steps"] = float(self.state.rejected_steps)
        metrics["learner/cut_steps"] = float(self.state.cut_steps)
        metrics["learner/jumps"] = float(self.state.jumps)
        if self.kl_control is not None and "learner/kl" in metrics:
            self.kl_control.update(metrics["learner/kl"], len(batch.prompt_lengths))
        metrics["learner/skipped_steps"] = float(self.state.skipped_steps)
        return metrics

    def _objective(self, batch, advantages, staleness, ref):
        logits = self.policy_opt.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        dists = response_log_dists(logits, batch)
        logprobs = token_logprobs(dists, batch)
        loss, metrics = self.method.policy_loss(logprobs, batch, advantages, staleness)
        if ref is not None:
            if self.config.kl_estimator == "exact":
                kl, kl_metrics = exact_kl_penalty(dists, ref, batch.action_mask)
            else:
                kl, kl_metrics = kl_penalty(logprobs, token_logprobs(ref, batch), batch.action_mask)
            loss = loss + self.kl_coef * kl
            metrics |= kl_metrics
        return loss, dists, metrics

    def _trust_region(self, batch, before_dists, before, step_kl):
        after = self.policy_opt.snapshot()

        def at(scale: float) -> list[torch.Tensor]:
            return [b + scale * (a - b) for a, b in zip(after, before)]

        def kl_at(scale: float) -> float:
            self.policy_opt.restore(at(scale))
            return self._step_kl(batch, before_dists)

        verdict = reference_trust_region(kl_at, step_kl, self.config.max_step_kl)
        self.policy_opt.restore(after if verdict.scale == 1.0 else before if verdict.scale == 0.0 else at(verdict.scale))
        return verdict

    @torch.no_grad()
    def _step_kl(self, batch, before):
        logits = self.policy_opt.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return token_kl(before, response_log_dists(logits, batch), batch.action_mask)
