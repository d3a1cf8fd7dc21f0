"""SAO's online learner: one rated response at a time, in arrival order, with a critic.

    learner = OnlineLearner.resume(learner_config, critic_config, base_model_dir, **parts)  # feedback, versions, operator, episodes
    while not stop: learner.step() or sleep(poll)

`step()` reads like the algorithm (docs/design.md, "SAO, section by section"):
  1. take the next B rated responses past the cursor (no groups, no waiting for a prompt's siblings)
  2. critic values (the forward of the first critic step: one forward serves both, critic/trainer.py)
  3. advantages: GAE over action tokens only, lambda_policy = 1 - 1/(alpha L); value targets with lambda_value
  4. K critic steps; 5. one policy step (two-sided ratio mask against the behavior logprobs, optional KL anchor),
     then its step KL (a forward at the new weights; the trust region measures cut-backs only as it needs them)
  6. every N steps or T seconds, publish the next version (`self.publishing`, learner/publishing.py):
     the version row and the cursor in ONE transaction, so a crash resumes from the last published
     version and re-reads exactly the ratings it had not published yet; then retention (retention.py).
With `[segments] adapters` on, one OnlineLearner is one segment's lane (learner/lanes.py): that segment's
LoRA adapter on the shared frozen base (learner/adapters.py), its ratings, cursor (`sao:cozy`), critic
and controllers; its KL reference is the base with the adapters off. With `[learner] ranks` N > 1 step 5
runs across N DeepSpeed ZeRO processes (ranks.py); this one is rank 0 and keeps the store, critic and
publishing. The baselines (`[learner] method`, methods.py) run through the same loop. A non-finite loss
or gradient skips the update (counted); only finite weights are published. The learner never talks to
the engine: the server activates published versions. `run()`: learner/loop.py; `status()`:
learner/status.py. Operators steer it through the store (`sync_with_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from liveloop.checkpoint import sweep_stale_staging
from liveloop.critic.config import CriticConfig
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model
from liveloop.learner.adapters import AdapterPolicy
from liveloop.learner.config import LearnerConfig
from liveloop.learner.diagnostics import StabilityWindow
from liveloop.learner.episodes import EpisodeSamples
from liveloop.learner import heap
from liveloop.learner.loop import run_lanes
from liveloop.learner.memory import MemoryRetreat, out_of_memory
from liveloop.learner.methods import make_method
from liveloop.learner.objective import policy_objective
from liveloop.learner.placement import Placement, placement
from liveloop.learner.position import LearnerState, critic_dir_for, stored_position
from liveloop.learner.publishing import HostState, VersionPublisher
from liveloop.learner.recompute import recomputed
from liveloop.learner.ranks import RankGroup
from liveloop.learner.restart import RestartOnDrop
from liveloop.learner.status import LaneStatus, LearnerStatus
from liveloop.grammar import Grammars, grammars_for
from liveloop.segments import BASE, SHARED, Lineage
from liveloop.rl.batch import Sample, TokenBatch, make_batch, policy_log_dists, scorable
from liveloop.rl.control import AdaptiveKLCoef, StepSizeControl, TrustRegionVerdict, trust_region
from liveloop.rl.diagnostics import token_entropy, token_kl
from liveloop.rl.optim import make_optimizer
from liveloop.store import VersionStatus
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.records import StoredFeedback, StoredResponse
from liveloop.store.versions import VersionQueries
from liveloop.transport import TransportConfig

log = logging.getLogger(__name__)


class SegmentRatings:
    """The store's ratings as one segment's lane reads them (a `RatingReads`, learner/episodes.py): only
    the ratings of responses that segment served."""

    def __init__(self, feedback: FeedbackQueries, segment: str):
        self.feedback, self.segment = feedback, segment

    def rated_after(self, feedback_id: int, limit: int) -> list[tuple[StoredFeedback, StoredResponse]]:
        return self.feedback.rated_after(feedback_id, limit, segment=self.segment)


class OnlineLearner:
    publisher = VersionPublisher  # how it publishes (learner/publishing.py)

    def __init__(
        self,
        config: LearnerConfig,
        critic_config: CriticConfig,
        base_model_dir: Path,
        state: LearnerState,
        policy_dir: str,
        critic_dir: str | None,
        *,
        feedback: FeedbackQueries,
        versions: VersionQueries,
        operator: OperatorQueries,
        episodes: EpisodeQueries,
        publish_status: VersionStatus = VersionStatus.PUBLISHED,
        lineage: Lineage = BASE,
        adapters: AdapterPolicy | None = None,
        transport: TransportConfig | None = None,
    ):
        torch.manual_seed(config.seed)
        if lineage.is_base != (adapters is None):
            raise ValueError("a segment's lane needs the shared AdapterPolicy, and only a lane takes one")
        sweep_stale_staging(config.checkpoint_dir)
        self.feedback, self.versions, self.operator = feedback, versions, operator
        self.lineage = lineage
        self.adapters = adapters
        self.cursor_name = lineage.lane(config.cursor_name)
        self.ratings = EpisodeSamples(
            feedback if lineage.is_base else SegmentRatings(feedback, lineage.segment), episodes,
            config.max_episode_tokens,
            config.episode_credit, config.episode_observations, check=self._scorable,
        )
        self.config = config
        self.base_model_dir = Path(base_model_dir)
        self.state = state
        self.critic_config = critic_config
        self.place: Placement = adapters.place if adapters is not None else placement(config)
        self.method = make_method(config)
        self.step_size, self.kl_control = self._controllers()
        self.restart = (
            RestartOnDrop(config.lora.restart_window, config.lora.restart_drop)
            if adapters is not None and config.lora.restart_window > 0 else None
        )
        self.window = StabilityWindow(config.diagnostics_window)
        # the KL anchor: the base model; a lane reaches it by turning its adapter off (no second copy)
        self.reference = (
            self.place.load_causal_lm(self.base_model_dir, trainable=False).eval()
            if config.kl_coef > 0 and adapters is None else None
        )
        self._load(policy_dir, critic_dir)
        self.idle_seconds = 0.0
        self.busy_seconds = 0.0
        self.memory = MemoryRetreat()  # where it stands after steps that ran out of memory
        self.recomputed_steps = 0  # steps whose batch was long enough to recompute activations (recompute_over_tokens)
        self.paused = False
        self.transport = transport
        self.publishing = self.publisher(
            self, versions, operator, config, self.cursor_name, lineage, publish_status, transport,
            self.base_model_dir,
        )

    def _grammars(self, samples: list[Sample]) -> Grammars | None:
        """The policy's tokenizer's grammars when a sample was sampled under one (forced tool calls,
        JSON output): its tokens are scored under the same masks (rl/batch.py)."""
        if all(s.grammar is None and not s.grammar_spans for s in samples):
            return None
        return grammars_for(str(self.base_model_dir), self.policy.config.vocab_size)

    def _scorable(self, sample: Sample) -> Sample:
        """`sample` if the policy can score it (its grammar's masks replayed), else Unscorable (rl/batch.py):
        the feed skips it, counted (learner/episodes.py), instead of a step raising on it again and again."""
        nan = self.config.episode_observations == "actions"  # NaN: a token scored on-policy (`_scored_on_policy`)
        return scorable(sample, self.policy.config.vocab_size, self._grammars([sample]), nan_logprobs=nan)

    def _load(self, policy_dir: str | None, critic_dir: str | None) -> None:
        """Load the policy (a lane: its adapter from `policy_dir`, or a fresh one when None) and the critic."""
        c = self.config
        if self.adapters is not None:
            self.policy = self.adapters.add(self.segment, policy_dir)  # only this adapter takes gradients now
        else:
            self.policy = self.place.load_causal_lm(policy_dir)
        self.policy_opt = self._optimizer(policy_dir)
        self.critic = self._critic(critic_dir or (policy_dir if self.adapters is None else str(self.base_model_dir)))

    def _critic(self, backbone: str) -> Critic | None:
        """The critic from `backbone` (a critic checkpoint, or a model whose trunk a cold critic starts
        from); None for a method without one."""
        if not self.method.uses_critic:
            return None
        c = self.config
        # a LoRA critic's frozen weights are the frozen base this learner holds anyway (a lane's shared base,
        # else the KL reference): one copy of the model for policy, reference and critic
        frozen = self.adapters.base_model if self.adapters is not None else self.reference
        model = build_value_model(backbone, self.place.dtype, self.critic_config.lora_rank, self.base_model_dir, share=frozen)
        return Critic(
            self.place.prepare(model.to(self.place.device)),
            self.critic_config, c.zero_stage if c.ranks == 1 else 0, c.batch_size, c.master_weights,
        )

    def _controllers(self) -> tuple[StepSizeControl | None, AdaptiveKLCoef | None]:
        """The step-size and KL-anchor controllers at their configured start (None where off)."""
        c = self.config
        step_size = (
            StepSizeControl(c.learning_rate, c.target_step_kl, c.min_learning_rate,
                            c.adapter_max_learning_rate if self.adapters is not None else c.max_learning_rate)
            if c.target_step_kl > 0 else None
        )
        kl_control = AdaptiveKLCoef(c.kl_coef, c.target_kl_to_base, c.kl_horizon) if c.target_kl_to_base > 0 and c.kl_coef > 0 else None
        return step_size, kl_control

    def _optimizer(self, policy_dir: str | None) -> Any:
        c = self.config
        if c.ranks > 1:  # the policy step across ranks (learner/ranks.py); one group for the process's life
            self.rank_group = getattr(self, "rank_group", None) or RankGroup.start(c)
            return self.rank_group.optimizer(self.policy, policy_dir, self.learning_rate, c)
        return make_optimizer(self.policy, self.learning_rate, c.max_grad_norm, c.zero_stage, c.batch_size, c.master_weights)

    def _start_over(self) -> None:
        """A lane's adapter back to a fresh one (it serves what the base serves), with a fresh optimizer and
        controllers (learner/restart.py says when); with `restart_critic` its critic back to its start
        (version 0's) too. The cursor and the counters carry on; the fresh adapter is published like any
        other update."""
        log.warning("learner %s: the mean reward fell %.2f below its best: the adapter starts over",
                    self.cursor_name, self.restart.drop)
        self.policy = self.adapters.add(self.segment, None)
        self.step_size, self.kl_control = self._controllers()
        self.policy_opt = self._optimizer(None)
        if self.config.lora.restart_critic and self.critic is not None:
            start = critic_dir_for(self.config, 0)
            self.critic = self._critic(str(start) if start.exists() else str(self.base_model_dir))
        self.method.reset()

    @contextlib.contextmanager
    def _policy_on(self) -> Iterator[None]:
        """A lane's adapter is the active one while it steps (lanes share the model); else nothing to do."""
        if self.adapters is None:
            yield
            return
        with self.adapters.active(self.segment):
            yield

    @property
    def kl_anchored(self) -> bool:
        return self.kl_coef > 0 and (self.reference is not None or self.adapters is not None)

    def _reference_log_dists(self, batch: TokenBatch) -> torch.Tensor:
        """The base policy's log-distributions on the batch (the KL anchor), without gradients (an inference
        tensor: only read, by the KL terms, never saved for a backward nor written)."""
        with torch.inference_mode():
            if self.adapters is not None:
                with self.adapters.base() as base:
                    return policy_log_dists(base, batch)
            return policy_log_dists(self.reference, batch)

    @property
    def learning_rate(self) -> float:
        """The policy's learning rate now: the config's, or where step-size control has moved it."""
        return self.step_size.lr if self.step_size is not None else self.config.learning_rate

    @property
    def kl_coef(self) -> float:
        """The KL anchor's coefficient now: the config's, or where the adaptive controller has moved it."""
        return self.kl_control.coef if self.kl_control is not None else self.config.kl_coef

    @property
    def segment(self) -> str | None:
        """The segment whose adapter this learner trains (None: the base weights)."""
        return self.lineage.segment

    @classmethod
    def resume(
        cls, config: LearnerConfig, critic_config: CriticConfig, base_model_dir: Path, *,
        feedback: FeedbackQueries, versions: VersionQueries, operator: OperatorQueries, episodes: EpisodeQueries, **kw,
    ) -> "OnlineLearner":
        """Start from the version this learner last published (or the base model), at its cursor."""
        state, policy_dir, critic_dir = stored_position(
            versions, feedback, config, Path(base_model_dir), kw.get("lineage", BASE), kw.get("transport"),
        )
        return cls(
            config, critic_config, base_model_dir, state, policy_dir, critic_dir,
            feedback=feedback, versions=versions, operator=operator, episodes=episodes, **kw,
        )

    def reload(self) -> None:
        """Drop what was trained since the last version and load the version the store's cursor
        names (after a rollback). Counters of steps and samples carry on. The durable checkpoints this
        learner still holds are written first: a rollback may have served one of them from memory, and the
        position read below would otherwise take that version for lost (`recover_durable`)."""
        self.publishing.wait_durable()
        state, policy_dir, critic_dir = stored_position(
            self.versions, self.feedback, self.config, self.base_model_dir, self.lineage, self.transport,
        )
        state.step, state.samples, state.skipped_steps = self.state.step, self.state.samples, self.state.skipped_steps
        self._load(policy_dir, critic_dir)
        self.method.reset()
        if self.restart is not None:
            self.restart.forget()
        self.state = state
        self.publishing.held_back = False  # what it held back is dropped with the rest

    def sync_with_store(self) -> bool:
        """Follow the operator: reload after a rollback or an operator's publish (either moves the
        cursor); returns whether learning is paused.

        Operators steer the learner through the store, so the same rules hold in or out of the server
        process: while its `learner_control` row says paused it neither trains nor publishes; when a
        rollback or an operator's publish (`POST /admin/weights`) moves its cursor to another version it
        reloads that version's weights and critic (a publish that races it is refused by the store's
        lineage check, and the learner reloads then)."""
        version = self.versions.cursor_version(self.cursor_name)
        if version is not None and version != self.state.version:
            log.warning(
                "learner %s: lineage moved from version %d to %d (a rollback, or an operator's publish): reloading",
                self.cursor_name, self.state.version, version,
            )
            self.reload()
        self.paused = self.operator.learning_paused(self.cursor_name)
        return self.paused

    # -- one step --------------------------------------------------------------------------------
    def step(self) -> bool:
        """Train on the next batch if it is there (SAO: the next B rated responses); returns whether it did."""
        with self._policy_on():
            return self._step()

    def _step(self) -> bool:
        c, s = self.config, self.state
        # 1. the next B rated responses, in arrival order (GRPO baselines: the next complete group)
        taken = self.method.next_batch(self.ratings, s.pending_cursor, most=self.memory.batch_limit)
        if taken is None:
            self._pass_untrained()
            return False
        samples, last_id = taken
        if self.memory.passes(last_id):  # it ran out of memory alone twice (learner/memory.py)
            self._pass_too_big(samples, last_id)
            return True
        started = time.perf_counter()
        updates = self.policy_opt.updates if c.ranks == 1 else 0  # across ranks a failure is not caught (below)
        try:
            host, host_values, host_advantages, metrics = self._train(samples)
        except Exception as exc:
            if c.ranks > 1 or not out_of_memory(exc):
                raise
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = None
        if error is not None:  # out here the failed step's frames, and the tensors they held, are gone
            self._out_of_memory(samples, last_id, error, policy_moved=self.policy_opt.updates != updates)
            self.busy_seconds += time.perf_counter() - started
            return True
        self.memory.stepped(last_id)
        self.publishing.supersede()  # a version held back for this step never is (coalesce_versions)
        metrics |= self.method.stats() | self.ratings.stats() | self.window.add(host, host_values, host_advantages)
        metrics |= self.memory.stats()
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
        # 6. publish every N steps or T seconds; with coalesce_versions not while the next rating already waits
        # (its step's version supersedes this one: learner/publishing.py)
        if s.steps_since_publish >= c.publish_every_steps and not self.publishing.hold_back(self._rating_waiting):
            self.publish()
        return True

    def _train(self, samples: list[Sample]) -> tuple[TokenBatch, torch.Tensor | None, torch.Tensor, dict[str, float]]:
        """Steps 2-5 on `samples`: the critic's values, the advantages, K critic steps, one policy step.
        Returns the host batch, its values and advantages, and the step's metrics."""
        c = self.config
        host = make_batch(samples, grammars=self._grammars(samples))
        if c.episode_observations == "actions" and bool(torch.isnan(host.behavior_logprobs).any()):  # the ablation's observations
            host = self._scored_on_policy(host)
        batch = self.place.batch(host)
        long_batch = 0 < c.recompute_over_tokens < batch.input_ids.numel()  # its activations recomputed (learner/recompute.py)
        with recomputed((self.policy_opt.module, self.critic.optimizer.module if self.critic is not None else None), long_batch):
            # 2. values of the states the tokens were chosen in: the forward of the first critic step, its graph kept
            # for step 4 (critic/trainer.py: the same weights on the same batch, so one forward serves both)
            values, first = self.critic.values_for_update(batch) if self.critic is not None else (None, None)
            host_values = values.float().cpu() if values is not None else None  # one transfer, used twice
            # 3. advantages (policy lambda adapts to length) and value targets (lambda_value): a scan over
            # each response's tokens, done on the host (one transfer, not one per token on an accelerator)
            host_advantages, returns = self.method.advantages(host, host_values)
            advantages = host_advantages.to(self.place.device)
            returns = returns.to(self.place.device) if returns is not None else None
            # 4. K critic steps (the first on step 2's forward). They could run beside step 5 (the policy step reads
            # only the values from before them), but in one process the GIL serialises two threads of this many
            # small ops: measured slower, not faster (docs/results/learner_step.md)
            metrics = self.critic.update(batch, returns, first) if self.critic is not None else {}
            del first
            # 5. one policy step
            metrics |= self._policy_step(batch, advantages)
        if c.recompute_over_tokens:
            self.recomputed_steps += int(long_batch)
            metrics["learner/recomputed_steps"] = float(self.recomputed_steps)
        return host, host_values, host_advantages, metrics

    def _out_of_memory(self, samples: list[Sample], last_id: int, error: str, policy_moved: bool) -> None:
        """A step on `samples` (through feedback `last_id`) ran out of memory (learner/memory.py): drop it
        and hand the heap back; the batch is retried smaller, or passed when it comes up again. If the
        policy's update had begun (`policy_moved`: the failure came in its optimizer or in the trust
        region's check after it), the learner reloads the version it last published; before that, the
        policy is as it was (the critic keeps the value steps that stood: one more fit to this batch)."""
        verdict = self.memory.failed(len(samples), last_id)
        log.error("learner %s: a step of %d rating(s) through feedback %d ran out of memory (%s): %s",
                  self.cursor_name, len(samples), last_id, error,
                  "retrying one rating at a time" if verdict == "retry" else "it will not be trained")
        for opt in (self.policy_opt, self.critic.optimizer if self.critic is not None else None):
            if opt is not None:
                opt.drop_grads()
        if policy_moved:  # the old models let go first: the reload needs no room beside them
            self.policy_opt = self.critic = None
            if self.adapters is None:
                self.policy = None
        gc.collect()
        heap.trim()
        if policy_moved:  # if it fails all the same, the learner's supervisor starts a fresh one
            self.reload()  # the batch passes when it comes up again, after what the reload trains again
        elif verdict == "pass":  # the cursor is where it was before this batch: past it now
            self.memory.passes(last_id)
            self._pass_too_big(samples, last_id)
        else:
            self.method.retake()
        self.state.last_metrics = dict(self.state.last_metrics) | self.memory.stats()

    def _pass_too_big(self, samples: list[Sample], last_id: int) -> None:
        """Consume `samples` untrained: counted and alarmed as skipped samples (`learner/skipped_samples_memory`)."""
        s = self.state
        for _ in samples:
            self.ratings.not_trained("memory")
        s.pending_cursor = last_id
        s.steps_since_publish += 1  # a publish is due for the cursor (no update)
        self.memory.stepped(last_id)
        s.last_metrics = dict(s.last_metrics) | self.ratings.stats() | self.memory.stats()
        log.warning("learner %s: %d rating(s) through feedback %d not trained: a step on them alone ran out of memory "
                    "twice (they stay in the store for a replay)", self.cursor_name, len(samples), last_id)

    def _pass_untrained(self) -> None:
        """Ratings the method read and trains none of (unscorable, capped) are consumed: the cursor moves
        past them and the next publish records it (a version if steps since the last one updated the
        policy, else the cursor alone: publishing.py), so a restart does not read them again."""
        s = self.state
        through = self.method.passed(s.pending_cursor)
        if through > s.pending_cursor:
            s.pending_cursor = through
            s.steps_since_publish += 1  # a publish is due for the cursor (no update: `updates_since_publish` stays)
            s.last_metrics = dict(s.last_metrics) | self.ratings.stats()

    def _rating_waiting(self) -> bool:
        """Whether a rating past the last one trained is already in the store (this lane's, for a lane)."""
        return bool(self.ratings.rated_after(self.state.pending_cursor, 1))

    @torch.no_grad()
    def _scored_on_policy(self, host: TokenBatch) -> TokenBatch:
        """`host` with every NaN behaviour logprob (a token nothing sampled: `episode_observations =
        "actions"`) replaced by the policy's own logprob of it now (its ratio is 1: never masked)."""
        batch = self.place.batch(host)
        own = policy_log_dists(self.policy, batch).gather(2, batch.response_ids[:, :, None])[:, :, 0].cpu()
        blp = host.behavior_logprobs
        return dataclasses.replace(host, behavior_logprobs=torch.where(torch.isnan(blp), own, blp))

    def _policy_step(self, batch: TokenBatch, advantages: torch.Tensor) -> dict[str, float]:
        c = self.config
        self.policy.train()
        staleness = (self.state.version - batch.versions).clamp(min=0)
        ref = self._reference_log_dists(batch) if self.kl_anchored else None
        before = dists = None
        if c.ranks > 1:  # every rank steps on its share; objective, entropy and step KL reduced over them
            norm, metrics = self.policy_opt.train(batch, advantages, staleness, ref, self.kl_coef)
        else:
            loss, dists, metrics = self._objective(batch, advantages, staleness, ref)
            metrics["learner/entropy"] = token_entropy(dists.detach(), batch.action_mask)
            before = self.policy_opt.snapshot() if c.max_step_kl > 0 else None
            norm = self.policy_opt.step(loss)  # None: the loss or gradient was not finite, nothing changed
        metrics["learner/lr"], metrics["learner/kl_coef"] = self.learning_rate, self.kl_coef
        if norm is None:
            self.state.skipped_steps += 1
            log.warning("learner step %d skipped: non-finite loss or gradient", self.state.step)
        else:
            metrics["learner/grad_norm"] = norm
            step_kl = metrics.pop("learner/step_kl") if dists is None else self._step_kl(batch, dists.detach())
            verdict = self._trust_region(batch, dists.detach(), before, step_kl) if before is not None else None
            if self.step_size is not None and (verdict is None or verdict.kind != "jump"):  # a jump says nothing of the rate
                # the rate follows what the update that stood moved the policy by (a cut-back's, not the full step's,
                # which on a policy with many cliffs would pin the rate to its floor); an undone update's says "smaller"
                moved = step_kl if verdict is None or verdict.kind == "undone" else verdict.kl
                self.policy_opt.set_lr(self.step_size.update(moved))
            # what the update that stood moved the policy by (an undone one: what it would have)
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

    def _objective(
        self, batch: TokenBatch, advantages: torch.Tensor, staleness: torch.Tensor, ref: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """What the policy step descends at the current weights: the method's policy loss plus the KL anchor
        to `ref` (the base's log-distributions; None: no anchor). Returns (loss, response log-dists, metrics)."""
        return policy_objective(
            self.policy_opt.module, self.method, self.config.kl_estimator, self.kl_coef, batch, advantages, staleness, ref
        )

    def _trust_region(self, batch: TokenBatch, before_dists: torch.Tensor, before: list[torch.Tensor], step_kl: float) -> TrustRegionVerdict:
        """Leave the weights at the part of the update the trust region lets stand (`rl.control.trust_region`:
        all, a cut-back, the smallest cut-back across a jump, or none), measuring cut-backs as it needs them."""
        saved: list[list[torch.Tensor]] = []  # the full update's weights, taken once a cut-back needs them

        def at(scale: float) -> list[torch.Tensor]:
            if not saved:
                saved.append(self.policy_opt.snapshot())
            return [b + scale * (a - b) for a, b in zip(saved[0], before)]

        def kl_at(scale: float) -> float:
            self.policy_opt.restore(at(scale))
            return self._step_kl(batch, before_dists)

        verdict = trust_region(kl_at, step_kl, self.config.max_step_kl)
        if verdict.scale == 0.0:
            self.policy_opt.restore(before)
        elif saved:  # a cut-back was measured: the weights are wherever it left them
            self.policy_opt.restore(saved[0] if verdict.scale == 1.0 else at(verdict.scale))
        # else the whole update stands and the weights are still it: nothing to put back
        return verdict

    @torch.inference_mode()
    def _step_kl(self, batch: TokenBatch, before: torch.Tensor) -> float:
        """KL(policy before || after this update) on the tokens it was trained on: how far one step moved it.
        Its forward is the one a step cannot share: the weights are new and the next batch is not this one."""
        return token_kl(before, policy_log_dists(self.policy_opt.module, batch), batch.action_mask)

    # -- publishing (what VersionPublisher needs: learner/publishing.py `Trainee`) ----------------------
    def publish(self) -> int | None:
        """Publish what was trained since the last version (`VersionPublisher.publish`)."""
        return self.publishing.publish()

    def full_policy(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        return self.policy_opt.full_parameters()

    def host_states(self) -> tuple[HostState, HostState | None]:
        """CPU copies of the policy's and the critic's weights (what a durable checkpoint is written from)."""
        def copy(module: torch.nn.Module, keep: Callable[[str], bool] = lambda name: True) -> HostState:
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items() if keep(k)}

        with self.policy_opt.full_parameters() as policy:
            policy_state = copy(policy)
        critic_state = None
        if self.critic is not None:
            # a LoRA critic is saved as its adapter and head (peft's save keeps those keys): no copy of the base
            own = (lambda k: "lora_" in k or "modules_to_save" in k) if self.critic_config.lora_rank > 0 else (lambda k: True)
            with self.critic.optimizer.full_parameters() as critic:
                critic_state = copy(critic, own)
        return policy_state, critic_state

    def save_policy(self, directory: Path, state: HostState | None = None) -> None:
        if self.adapters is not None:  # a lane's adapter (lanes never publish in memory: no host copy)
            self.adapters.save(self.segment, directory)
            return
        with self.policy_opt.full_parameters() as policy:
            policy.save_pretrained(str(directory), state_dict=state)

    def save_critic(self, directory: Path, state: HostState | None = None) -> None:
        if state is not None:
            self.critic.model.save_pretrained(str(directory), state_dict=state)
        elif self.critic is not None:
            self.critic.save(str(directory))

    # -- status and loop -------------------------------------------------------------------------
    def lane_status(self) -> LaneStatus:
        """Where this learner (or lane) stands: its version, cursor, counters, pause and last metrics."""
        s = self.state
        return LaneStatus(
            segment=self.segment, version=s.version, cursor=s.cursor, pending_cursor=s.pending_cursor, step=s.step,
            samples=s.samples, skipped_steps=s.skipped_steps, paused=self.paused, busy_seconds=self.busy_seconds,
            idle_seconds=self.idle_seconds, metrics=dict(s.last_metrics) | self.ratings.stats() | self.publishing.stats(),
        )

    def status(self) -> LearnerStatus:
        """This learner as a learner of one lane (a lane's adapters mode, `[segments] adapters`, from its segment)."""
        mode = "none" if self.segment is None else "shared" if self.segment == SHARED else "segment"
        return LearnerStatus(mode, (self.lane_status(),))

    def run(self, should_stop: Callable[[], bool], max_steps: int | None = None) -> None:
        """Train until `should_stop()` (or until `state.step` reaches `max_steps`); publishes what is
        pending before returning (unless paused: then the unpublished ratings are trained again after
        the next start). The loop is learner/loop.py's, with this learner as its one lane."""
        run_lanes([self], should_stop, max_steps, self.config.poll_seconds)
