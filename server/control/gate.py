"""The release gate: how a learner's version reaches users under `[release] mode` (liveloop.release;
operator's view: docs/operations.md, "Releasing versions").

`ReleaseGate.run` is a loop beside the activator's watcher (started by liveloop/app.py), every `[server]
watch_seconds`. The store owns the statuses (`start_canary`, `activate_version`, `hold_version`); the
candidates' engine side is server/control/candidates.py (`load`, `promote`, `drop`, under the activator's
lock, with the weights found and verified as for every activation); the gate decides (release/decision.py)
and evaluates. Each gated lineage (the base weights' under `canary` / `gated`: `Activator.gate_base`; a
segment's adapters whose mode is not `immediate`: `Activator.gate_segments`) is activated by the gate
alone, one pass (`_step`) at a time: mirror the store's candidate, start the next, evaluate, decide.

- `canary`: a request is served by the candidate when its user (the request's `user` field, else its API
  key; release/routing.py) falls in `canary_fraction` and the request has no segment (a segment's
  candidate: its canary requests only); `gated`: no user is served by it.
- `immediate` (with `[release.evaluation] immediate`): gates nothing; evaluates new serving versions.
- In a fleet every replica mirrors the store's candidate, so each routes the same users to it; only the
  leader (server/control/leader.py) starts candidates, evaluates and decides, each store write fenced by
  its lease term (store/lease.py).

The base lineage's candidate is a second engine (`CanaryEngine`, server/engines/canary.py): on vLLM it
starts with the server (its start blocks the event loop: liveloop/app.py), on hf off the loop at the first
candidate. A segment's candidate is a second adapter slot of the live engine (`<segment>@candidate`),
built on the hf engine's adapters; on vLLM a non-immediate segment mode is refused at start
(`gated_segments`: a ConfigError) until its LoRA slots are verified on a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from liveloop.config_types import ConfigError
from liveloop.metrics import Metrics
from liveloop.segments import BASE, Lineage
from liveloop.release.config import Mode, ReleaseConfig
from liveloop.release.decision import Decision, decide
from liveloop.release.routing import in_canary
from liveloop.server.control.candidates import Candidates
from liveloop.server.engines.base import Engine
from liveloop.server.engines.canary import SLOT_SUFFIX, CanaryEngine
from liveloop.server.engines.registry import names_with
from liveloop.server.control.activator import Activator
from liveloop.store import TransitionRefused, VersionRecord, VersionStatus
from liveloop.store.lease import StaleLeader
from liveloop.store.operator import OperatorQueries
from liveloop.store.records import VersionTraffic
from liveloop.store.release import ReleaseQueries
from liveloop.store.versions import VersionQueries

log = logging.getLogger(__name__)

# evaluate(candidate engine, candidate, live engine, live) -> an Evaluation (release/evaluation.py); a
# segment candidate's engine is the live one, its adapter slot reached by a canary request of its segment
Evaluate = Callable[[Engine, VersionRecord, Engine, VersionRecord], Awaitable[Any]]
SLOT_BACKENDS = names_with("adapter_slots")  # the backends whose adapter slots a segment candidate is served from


def fenced_term(term: int) -> int | None:
    """The term a leader's store write carries: None (unfenced) for a gate without a lease (term 0)."""
    return term or None


def gated_segments(config: ReleaseConfig, segments: tuple[str, ...], backend: str) -> tuple[str, ...]:
    """The segment lineages the gate tries candidates of (a mode other than `immediate`, a segment's
    override or `[release] mode`). Raises ConfigError when the backend has no verified adapter slots
    (vLLM: not yet verified on a GPU) or a segment's name holds the slot marker."""
    gated = tuple(s for s in segments if config.mode_of(Lineage(s)) != "immediate")
    odd = [s for s in gated if SLOT_SUFFIX in s]
    if odd:
        raise ConfigError(f"[segments] names {odd}: a gated segment's name may not contain {SLOT_SUFFIX!r}")
    if gated and backend not in SLOT_BACKENDS:
        modes = ", ".join(f"{s} = {config.mode_of(Lineage(s))!r}" for s in gated)
        immediate = ", ".join(f'{s} = "immediate"' for s in gated)
        raise ConfigError(
            f"[release] segment lineages {modes}: a segment candidate is served from a second adapter slot of the live "
            f"engine, built on the {', '.join(SLOT_BACKENDS)} engine only (engine.backend = {backend!r}); set "
            f"[release] segments = {{ {immediate} }} to release them immediately"
        )
    return gated


GATED_BACKENDS = names_with("release_gate")  # the backends the release gate runs on


def wants_gate(config: ReleaseConfig, segments: tuple[str, ...], backend: str) -> bool:
    """Whether a server runs the release gate (and so a candidate engine): a canary or gated mode, or
    immediate mode with `[release.evaluation] immediate` on (each new serving version evaluated, gating
    nothing), or a segment adapter lineage in a canary or gated mode. Refuses a gated mode on the other
    backends (sglang's engine is a client of one SGLang server: a second one would share its weights; a
    diffusion model is not a causal LM the evaluation can score), and a gated segment on a backend
    without adapter slots (`gated_segments`: a ConfigError)."""
    evaluates_immediate = config.evaluation.enabled and config.evaluation.immediate
    if backend not in GATED_BACKENDS:
        if config.mode != "immediate" or evaluates_immediate:
            raise ConfigError(
                f"[release] mode = {config.mode!r} (or an evaluation in immediate mode) needs a second engine for the "
                f"candidate and a causal LM to evaluate: backends {', '.join(GATED_BACKENDS)}, not {backend}"
            )
        gated_segments(config, segments, backend)  # raises for a gated segment
        return False
    return config.mode != "immediate" or evaluates_immediate or bool(gated_segments(config, segments, backend))


@dataclass(frozen=True)
class CandidateState:
    """A lineage's candidate as the gate sees it now (GET /admin/release)."""

    version: int
    status: VersionStatus
    loaded: bool  # in this replica's candidate engine (a segment's: its candidate adapter slot)
    traffic: VersionTraffic
    live_traffic: VersionTraffic
    evaluation: str  # "running" | "passed" | "failed" | "none"
    decision: Decision | None  # the gate's verdict at its last pass


@dataclass(frozen=True)
class LineageState:
    """A segment's adapter lineage under the gate: its mode, the version serving it (None: the base
    weights), its candidate."""

    segment: str
    mode: Mode
    serving: int | None
    candidate: CandidateState | None


@dataclass(frozen=True)
class ReleaseState:
    mode: Mode
    segment_modes: dict[str, Mode]  # the mode each segment lineage is released in
    canary_fraction: float
    serving: int
    candidate: CandidateState | None
    evaluating: int | None  # the version whose evaluation runs now (the base lineage's, else a segment's)
    lineages: tuple[LineageState, ...] = ()  # the gated segments' lineages


@dataclass
class GatedLineage:
    """The gate's own state of one lineage (`Lineage`: the base weights or a segment's adapter): its mode
    and its running evaluation."""

    lineage: Lineage
    mode: Mode
    task: asyncio.Task | None = field(default=None, repr=False)
    task_version: int | None = None

    @property
    def segment(self) -> str | None:
        return self.lineage.segment

    def running(self) -> int | None:
        return self.task_version if self.task is not None and not self.task.done() else None


class ReleaseGate:
    def __init__(
        self, config: ReleaseConfig, activator: Activator, engine: CanaryEngine,
        versions: VersionQueries, operator: OperatorQueries, release: ReleaseQueries, metrics: Metrics,
        evaluate: Evaluate | None = None, leader: Callable[[], int | None] | None = None,
    ):
        self.config = config
        # the leader lease's term this replica leads the fleet in now, None when another replica leads
        # (server/control/leader.py `held_term`); 0 (the default: a lone gate without a lease) is not fenced
        self.leader: Callable[[], int | None] = leader or (lambda: 0)
        self.activator = activator
        self.engine = engine
        self.candidates = Candidates(activator, engine)
        self.versions, self.operator, self.release = versions, operator, release
        self.metrics = metrics
        self.evaluate = evaluate if config.evaluation.enabled else None
        self.mode: Mode = config.mode_of(BASE)
        self.decisions: dict[int, Decision] = {}  # version -> the last verdict on it
        self._evaluated: set[int] = set()  # versions whose evaluation this gate started (or found stored)
        self._base = GatedLineage(BASE, self.mode)
        gated = tuple(s for s in activator.segments if config.mode_of(Lineage(s)) != "immediate")
        self._segments = {s: GatedLineage(Lineage(s), config.mode_of(Lineage(s))) for s in gated}
        activator.gate_segments = frozenset(gated)  # the watcher activates nothing of these lineages
        for segment in config.segments:
            if segment not in activator.segments:
                log.warning("[release] segments.%s: no such segment lineage here (segments: %s)", segment, ", ".join(activator.segments) or "none")

    @property
    def _task(self) -> asyncio.Task | None:  # the base lineage's evaluation (tests and state read it)
        return self._base.task

    @property
    def _task_version(self) -> int | None:
        return self._base.task_version

    def routes_to_candidate(self, user: str, lineage: Lineage) -> bool:
        """Whether a request of `user` (release/routing.py `user_key`) is served by its lineage's
        candidate now: the base candidate for a request without a segment, the segment's candidate
        adapter for one of a gated segment."""
        gated = self._base if lineage.is_base else self._segments.get(lineage.segment)
        return (
            gated is not None and gated.mode == "canary" and self.candidates.loaded(lineage) is not None
            and in_canary(user, self.config.canary_fraction)
        )

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self, poll_seconds: float) -> None:
        """One `step` every `poll_seconds`, until cancelled."""
        try:
            while True:
                try:
                    await self.step()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("release gate")
                await asyncio.sleep(poll_seconds)
        finally:
            await self.close()

    async def close(self) -> None:
        for lineage in (self._base, *self._segments.values()):
            if lineage.task is not None and not lineage.task.done():
                lineage.task.cancel()
                try:
                    await lineage.task
                except BaseException:
                    pass

    async def step(self) -> Decision | None:
        """One pass over every lineage (see the module docstring): the base lineage's, then each gated
        segment's (one lineage's failure is logged and leaves the others' passes). Returns the decision
        taken on the base lineage's candidate, if any (every verdict is in `decisions`)."""
        decision = None
        if self.mode == "immediate":
            if self.config.evaluation.immediate:
                await self._evaluate_serving()
        else:
            decision = await self._step(self._base)
        for lineage in self._segments.values():
            try:
                await self._step(lineage)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("release gate: segment %s", lineage.segment)
        return decision

    async def step_segment(self, segment: str) -> Decision | None:
        """One pass over `segment`'s lineage alone; the decision taken on its candidate, if any."""
        return await self._step(self._segments[segment])

    async def _step(self, lineage: GatedLineage) -> Decision | None:
        """One pass over one gated lineage: (1) mirror the store's CANARY version into the candidate
        slot (a candidate the store no longer names, rolled back or held by another replica, is
        dropped); (2) with none, make the newest PUBLISHED version descending from the serving one the
        candidate (`start_canary`, which supersedes the older ones: each newer version holds their
        training, "newest wins"), unless learning is paused; (3) start its evaluation in the background
        (once per version, against the live version) and store it; an evaluation that raises is stored
        as failed (a candidate nobody could evaluate does not pass); (4) decide: promote (the candidate
        becomes the live one at once, the store makes it SERVING), hold (the store's `hold_version`:
        HELD, the versions trained on from it superseded, the lane's learner cursor back on the live
        version or adapter, its feedback position kept; an event `release_held` and the
        `server/release_held` metric), or wait. A pause also holds back promotion. While a candidate is
        tried the learner trains on from it; those versions wait, and the newest descending from the
        (new) serving version is next. Followers in a fleet stop after (1): they follow a promotion (the
        activator's follower rule) and a hold (the dropped candidate). Each of the leader's store writes
        carries the term its pass began in: refused (StaleLeader) once the lease changed hands, so a
        leader paused or cut off past its lease decides nothing. A segment's candidate is evaluated
        through its slot against the segment's live adapter (or the base weights), and its ratings are
        compared with that adapter's (the base version's, all base requests included, when it has none)."""
        segment = lineage.segment
        canary = await asyncio.to_thread(self.versions.canary_version, segment)
        paused = await asyncio.to_thread(self.operator.learning_paused, self.activator.lane(lineage.lineage))
        if canary is None:
            if self.candidates.loaded(lineage.lineage) is not None:
                await self.candidates.drop(lineage.lineage)
            self._cancel_evaluation(lineage)
            term = self.leader()
            if paused or term is None:
                return None
            canary = await self._start_next(lineage, term)
            if canary is None:
                return None
        if lineage.lineage.is_base:
            await self.engine.prepare()  # outside the activator's lock: an engine's start holds back no activation
        if not await self.candidates.load(canary):
            return None
        term = self.leader()
        if term is None:  # a follower routes to the store's candidate; the leader evaluates and decides
            self._cancel_evaluation(lineage)
            return None
        live = await asyncio.to_thread(self.versions.get_version, self._live_version(lineage.lineage))
        if live is None:
            return None
        self._ensure_evaluation(lineage, canary, live, term)
        decision = await self._decide(lineage, canary, live)
        self.decisions[canary.version] = decision
        if decision.action == "promote" and not paused:
            await self._promote(lineage, canary, decision, term)
        elif decision.action == "hold":
            await self._hold(lineage, canary, decision, term)
        return decision

    def _live_version(self, lineage: Lineage) -> int:
        """What serves the lineage's users now: the base version, or the segment's adapter (the base
        version when it has none)."""
        serving = self.activator.serving_in(lineage)
        return self.engine.version if serving is None else serving

    async def _start_next(self, lineage: GatedLineage, term: int) -> VersionRecord | None:
        """The newest PUBLISHED version past the serving one that the store accepts as the candidate
        (None also when the store says this replica no longer leads in `term`)."""
        segment = lineage.segment
        serving = self.activator.serving_in(lineage.lineage)
        after = -1 if serving is None else serving
        published = await asyncio.to_thread(self.versions.versions_with_status, VersionStatus.PUBLISHED, after, segment)
        for record in reversed(published):
            try:
                canary = await asyncio.to_thread(self.versions.start_canary, record.version, fenced_term(term))
            except StaleLeader as exc:
                log.warning("version %d not made the candidate: %s", record.version, exc)
                return None
            except TransitionRefused as exc:  # off the serving line, or another replica started one first
                log.debug("version %d not the candidate: %s", record.version, exc)
                other = await asyncio.to_thread(self.versions.canary_version, segment)
                if other is not None:
                    return other
                continue
            self.metrics.inc("server/release_candidates")
            log.info("version %d is the candidate of %s (%s mode)", canary.version, lineage.lineage, lineage.mode)
            return canary
        return None

    async def _decide(self, lineage: GatedLineage, canary: VersionRecord, live: VersionRecord) -> Decision:
        traffic = await asyncio.to_thread(self.release.version_traffic, True, (canary.version, live.version))
        evaluation = await asyncio.to_thread(self.release.evaluation, canary.version)
        return decide(
            traffic.get(canary.version) or VersionTraffic(canary.version, 0, 0, 0),
            traffic.get(live.version) or VersionTraffic(live.version, 0, 0, 0),
            None if evaluation is None else evaluation.passed,
            lineage.mode,
            self.config,
        )

    async def _promote(self, lineage: GatedLineage, canary: VersionRecord, decision: Decision, term: int) -> None:
        result = await self.candidates.promote(canary, fenced_term(term))
        if result is None:
            return
        self._cancel_evaluation(lineage)
        self.metrics.inc("server/release_promotions")
        log.info("candidate %d of %s promoted over %d: %s", canary.version, lineage.lineage, result.parent, decision.reason)

    async def _hold(self, lineage: GatedLineage, canary: VersionRecord, decision: Decision, term: int) -> None:
        detail = {"mode": lineage.mode, "p_worse": decision.p_worse, "live": self._live_version(lineage.lineage)}
        try:
            await asyncio.to_thread(
                self.versions.hold_version, canary.version, decision.reason, self.activator.lane(lineage.lineage), detail, fenced_term(term),
            )
        except StaleLeader as exc:  # deposed since the pass began: the candidate stays for the new leader
            log.warning("candidate %d not held: %s", canary.version, exc)
            self._cancel_evaluation(lineage)
            return
        except TransitionRefused as exc:  # rolled back, or another replica decided first
            log.info("candidate %d not held here: %s", canary.version, exc)
        await self.candidates.drop(lineage.lineage)
        self._cancel_evaluation(lineage)
        self.metrics.inc("server/release_held")
        log.warning("candidate %d held: %s (version %d keeps serving)", canary.version, decision.reason, self._live_version(lineage.lineage))

    # -- evaluation ----------------------------------------------------------------------------------
    def _ensure_evaluation(self, lineage: GatedLineage, canary: VersionRecord, live: VersionRecord, term: int) -> None:
        if self.evaluate is None or canary.version in self._evaluated:
            return
        if lineage.task is not None and not lineage.task.done():
            if lineage.task_version == canary.version:
                return
            lineage.task.cancel()
        self._evaluated.add(canary.version)
        lineage.task_version = canary.version
        live_engine = self.engine.live if lineage.lineage.is_base else self.engine
        lineage.task = asyncio.create_task(self._evaluation(lineage, canary, live, live_engine, term), name=f"evaluation-{canary.version}")

    def _cancel_evaluation(self, lineage: GatedLineage) -> None:
        if lineage.task is not None and not lineage.task.done():
            lineage.task.cancel()

    async def _evaluation(
        self, lineage: GatedLineage, canary: VersionRecord, live: VersionRecord, live_engine: Engine | None, term: int,
    ) -> None:
        """Evaluate the loaded candidate against `live` on `live_engine` (None: the candidate engine
        itself) and store the result, as the leader of `term` (refused when deposed since: the new
        leader evaluates); an evaluation that raises is stored as failed, with the error as its one
        check. A segment's candidate is sampled on the live engine, through its adapter slot."""
        assert self.evaluate is not None
        if await asyncio.to_thread(self.release.evaluation, canary.version) is not None:
            return  # another replica (or an earlier run of this server) evaluated it
        candidate_engine = self.engine.candidate if lineage.lineage.is_base else self.engine
        if candidate_engine is None or self.candidates.loaded(lineage.lineage) != canary.version:
            self._evaluated.discard(canary.version)
            return
        start = time.perf_counter()
        try:
            result = await self.evaluate(candidate_engine, canary, live_engine or candidate_engine, live)
            checks = [check.as_dict() if hasattr(check, "as_dict") else dict(vars(check)) for check in result.checks]
            row = (result.live_version, bool(result.passed), checks, float(result.seconds), float(result.engine_seconds))
        except asyncio.CancelledError:
            self._evaluated.discard(canary.version)
            raise
        except Exception as exc:
            log.exception("evaluation of version %d failed", canary.version)
            error = {"name": "error", "value": None, "live": None, "base": None, "bound": str(exc)[:500], "passed": False}
            row = (live.version, False, [error], time.perf_counter() - start, 0.0)
        try:
            await asyncio.to_thread(self.release.record_evaluation, canary.version, *row, fenced_term(term))
        except StaleLeader as exc:
            self._evaluated.discard(canary.version)
            log.warning("evaluation of version %d not stored: %s", canary.version, exc)
            return
        self.metrics.observe("server/evaluation_seconds", row[3])
        self.metrics.inc("server/evaluations", passed=str(row[1]).lower())
        log.info("version %d evaluated in %.1f s: %s", canary.version, row[3], "passed" if row[1] else "failed")

    async def _evaluate_serving(self) -> None:
        """Immediate mode: evaluate the serving version if it is new, on the candidate engine (no user is
        routed to it in this mode), against itself as the live version (nothing is gated: the bounds
        against the base say how far it moved). The leader's alone."""
        term = self.leader()
        if term is None:
            return
        base = self._base
        if self.evaluate is None or base.running() is not None:
            return
        version = self.engine.version
        if version in self._evaluated:
            return
        record = await asyncio.to_thread(self.versions.get_version, version)
        if record is None or record.parent is None:  # the base model: nothing learned to evaluate
            self._evaluated.add(version)
            return
        if await asyncio.to_thread(self.release.evaluation, version) is not None:
            self._evaluated.add(version)
            return
        await self.engine.prepare()
        if not await self.candidates.load(record):
            return
        self._evaluated.add(version)
        base.task_version = version
        base.task = asyncio.create_task(self._evaluation(base, record, record, None, term), name=f"evaluation-{version}")

    # -- what operators see --------------------------------------------------------------------------
    def state(self) -> ReleaseState:
        """The mode, each lineage's candidate with its traffic against the live version's, its
        evaluation state and the last verdict (blocking: run it off the event loop)."""
        serving = self.engine.version
        traffic = self.release.version_traffic(True)
        candidate = self._candidate_state(self._base, serving, traffic) if self.mode != "immediate" else None
        lineages = tuple(
            LineageState(s, lineage.mode, self.engine.adapter_version(s), self._candidate_state(lineage, self._live_version(lineage.lineage), traffic))
            for s, lineage in self._segments.items()
        )
        evaluating = self._base.running()
        if evaluating is None:
            evaluating = next((v for v in (lineage.running() for lineage in self._segments.values()) if v is not None), None)
        modes = {s: self.config.mode_of(Lineage(s)) for s in self.activator.segments}
        modes.update({s: m for s, m in self.config.segments.items() if s not in modes})
        return ReleaseState(self.mode, modes, self.config.canary_fraction, serving, candidate, evaluating, lineages)

    def _candidate_state(self, lineage: GatedLineage, live: int, traffic: dict[int, VersionTraffic]) -> CandidateState | None:
        canary = self.versions.canary_version(lineage.segment)
        if canary is None:
            return None
        evaluation = self.release.evaluation(canary.version)
        if evaluation is not None:
            state = "passed" if evaluation.passed else "failed"
        elif lineage.running() == canary.version:
            state = "running"
        else:
            state = "none"
        return CandidateState(
            canary.version, canary.status, self.candidates.loaded(lineage.lineage) == canary.version,
            traffic.get(canary.version) or VersionTraffic(canary.version, 0, 0, 0),
            traffic.get(live) or VersionTraffic(live, 0, 0, 0),
            state, self.decisions.get(canary.version),
        )
