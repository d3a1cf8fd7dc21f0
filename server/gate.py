"""The release gate: how a learner's version reaches users under `[release] mode` (liveloop.release).

`ReleaseGate.run` is a loop beside the publisher's watcher (server/app.py), every `[server]
watch_seconds`. The store owns the statuses (`start_canary`, `activate_version`, `hold_version`); the
publisher owns the engine (`load_candidate`, `promote_candidate`, `drop_candidate`, with the weights
found and verified as for every activation); the gate decides (release/decision.py) and evaluates.

- `canary` / `gated` (the base weights' lineage): the publisher's watcher activates nothing of the
  lineage (`Publisher.gate_base`). Each pass the gate (1) mirrors the store's CANARY version into the
  engine's candidate slot (so every replica of a fleet holds the same candidate and routes the same users
  to it; a candidate the store no longer names, rolled back or held by another replica, is dropped);
  (2) with none, makes the newest PUBLISHED version descending from the serving one the candidate
  (`start_canary`, which supersedes the older ones: each newer version holds their training, "newest
  wins"), unless learning is paused; (3) starts its evaluation in the background (once per version, on
  the candidate engine, against the live engine) and stores it (`record_evaluation`); an evaluation that
  raises is stored as failed (a candidate nobody could evaluate does not pass); (4) decides: promote
  (the candidate engine becomes the live one at once, the store makes it SERVING), hold (the store's
  `hold_version`: HELD, the versions trained on from it superseded, the learner back on the live
  version's weights with its feedback position kept; the candidate engine serves no one; an event
  `release_held` and the `server/release_held` metric), or wait. A pause also holds back promotion.
  While one candidate is tried the learner trains on from it and publishes; those versions wait, and
  when the candidate is decided the newest of those descending from the (new) serving version is next.
- In a fleet (several replicas on one store) every replica's gate does (1), so each routes the same
  users to the same candidate, but only the leader (`leader`, server/leader.py) starts candidates,
  evaluates and decides (and evaluates in immediate mode): one evaluation per candidate, one decision;
  the others follow a promotion (the publisher's follower rule) and a hold (the candidate the store no
  longer names is dropped).
- In `canary` mode a request is served by the candidate when its user (the request's `user` field, else
  its API key; release/routing.py) falls in `canary_fraction` and the request has no segment; in
  `gated` mode no user is served by it.
- `immediate` with `[release.evaluation] immediate = true` (else no gate runs): the watcher activates
  as before; the gate evaluates the serving version when it is new
  (newest first: versions replaced before the gate was free are skipped), on the candidate engine so
  the evaluation neither runs on nor is disturbed by the swaps of the engine users are on. Gates nothing.

On vLLM the candidate engine starts with the server (its start blocks the event loop: server/app.py);
on hf it starts, off the loop, at the first candidate.

Segment adapter lineages are released immediately whatever `[release] segments` says (the candidate
engine holds base weights only); a non-immediate mode for a segment is logged at start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from liveloop.metrics import Metrics
from liveloop.release.config import Mode, ReleaseConfig
from liveloop.release.decision import Decision, decide
from liveloop.release.routing import in_canary
from liveloop.server.engines.base import Engine
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.publisher import Publisher
from liveloop.store import Store, TransitionRefused, VersionRecord, VersionStatus
from liveloop.store.records import VersionTraffic

log = logging.getLogger(__name__)

# evaluate(candidate engine, candidate, live engine, live) -> an Evaluation (release/evaluation.py)
Evaluate = Callable[[Engine, VersionRecord, Engine, VersionRecord], Awaitable[Any]]


@dataclass(frozen=True)
class CandidateState:
    """The base lineage's candidate as the gate sees it now (GET /admin/release)."""

    version: int
    status: VersionStatus
    loaded: bool  # in this replica's candidate engine
    traffic: VersionTraffic
    live_traffic: VersionTraffic
    evaluation: str  # "running" | "passed" | "failed" | "none"
    decision: Decision | None  # the gate's verdict at its last pass


@dataclass(frozen=True)
class ReleaseState:
    mode: Mode
    segment_modes: dict[str, Mode]  # as configured (released immediately: see the module docstring)
    canary_fraction: float
    serving: int
    candidate: CandidateState | None
    evaluating: int | None  # the version whose evaluation runs now


class ReleaseGate:
    def __init__(
        self, config: ReleaseConfig, publisher: Publisher, engine: CanaryEngine, store: Store, metrics: Metrics,
        evaluate: Evaluate | None = None, leader: Callable[[], bool] | None = None,
    ):
        self.config = config
        self.leader = leader or (lambda: True)  # whether this replica leads the fleet (server/leader.py)
        self.publisher = publisher
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.evaluate = evaluate if config.evaluation.enabled else None
        self.mode: Mode = config.mode_of(None)
        self.decisions: dict[int, Decision] = {}  # version -> the last verdict on it
        self._task: asyncio.Task | None = None
        self._task_version: int | None = None
        self._evaluated: set[int] = set()  # versions whose evaluation this gate started (or found stored)
        for segment, mode in config.segments.items():
            if mode != "immediate":
                log.warning("[release] segments.%s = %r: segment adapters are released immediately (the gate tries base versions only)", segment, mode)

    def routes_to_candidate(self, user: str, segment: str | None) -> bool:
        """Whether a request of `user` (release/routing.py `user_key`) is served by the candidate now."""
        return (
            self.mode == "canary" and segment is None and self.engine.candidate_version is not None
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
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass

    async def step(self) -> Decision | None:
        """One pass (see the module docstring); the decision taken on the candidate, if any."""
        if self.mode == "immediate":
            await self._evaluate_serving()
            return None
        canary = await asyncio.to_thread(self.store.canary_version)
        paused = await asyncio.to_thread(self.store.learning_paused, self.publisher.learner_name)
        if canary is None:
            if self.engine.candidate_version is not None:
                await self.publisher.drop_candidate()
            self._cancel_evaluation()
            if paused or not self.leader():
                return None
            canary = await self._start_next()
            if canary is None:
                return None
        await self.engine.prepare()  # outside the publisher's lock: an engine's start holds back no activation
        if not await self.publisher.load_candidate(canary):
            return None
        if not self.leader():  # a follower routes to the store's candidate; the leader evaluates and decides
            self._cancel_evaluation()
            return None
        live = await asyncio.to_thread(self.store.get_version, self.engine.version)
        if live is None:
            return None
        self._ensure_evaluation(canary, live)
        decision = await self._decide(canary, live)
        self.decisions[canary.version] = decision
        if decision.action == "promote" and not paused:
            await self._promote(canary, decision)
        elif decision.action == "hold":
            await self._hold(canary, decision)
        return decision

    async def _start_next(self) -> VersionRecord | None:
        """The newest PUBLISHED version past the serving one that the store accepts as the candidate."""
        published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, self.engine.version)
        for record in reversed(published):
            try:
                canary = await asyncio.to_thread(self.store.start_canary, record.version)
            except TransitionRefused as exc:  # off the serving line, or another replica started one first
                log.debug("version %d not the candidate: %s", record.version, exc)
                other = await asyncio.to_thread(self.store.canary_version)
                if other is not None:
                    return other
                continue
            self.metrics.inc("server/release_candidates")
            log.info("version %d is the candidate (%s mode)", canary.version, self.mode)
            return canary
        return None

    async def _decide(self, canary: VersionRecord, live: VersionRecord) -> Decision:
        traffic = await asyncio.to_thread(self.store.version_traffic, True)
        evaluation = await asyncio.to_thread(self.store.evaluation, canary.version)
        return decide(
            traffic.get(canary.version) or VersionTraffic(canary.version, 0, 0, 0),
            traffic.get(live.version) or VersionTraffic(live.version, 0, 0, 0),
            None if evaluation is None else evaluation.passed,
            self.mode,
            self.config,
        )

    async def _promote(self, canary: VersionRecord, decision: Decision) -> None:
        result = await self.publisher.promote_candidate(canary)
        if result is None:
            return
        self._cancel_evaluation()
        self.metrics.inc("server/release_promotions")
        log.info("candidate %d promoted over %d: %s", canary.version, result.parent, decision.reason)

    async def _hold(self, canary: VersionRecord, decision: Decision) -> None:
        detail = {"mode": self.mode, "p_worse": decision.p_worse, "live": self.engine.version}
        try:
            await asyncio.to_thread(self.store.hold_version, canary.version, decision.reason, self.publisher.lane(None), detail)
        except TransitionRefused as exc:  # rolled back, or another replica decided first
            log.info("candidate %d not held here: %s", canary.version, exc)
        await self.publisher.drop_candidate()
        self._cancel_evaluation()
        self.metrics.inc("server/release_held")
        log.warning("candidate %d held: %s (version %d keeps serving)", canary.version, decision.reason, self.engine.version)

    # -- evaluation ----------------------------------------------------------------------------------
    def _ensure_evaluation(self, canary: VersionRecord, live: VersionRecord) -> None:
        if self.evaluate is None or canary.version in self._evaluated:
            return
        if self._task is not None and not self._task.done():
            if self._task_version == canary.version:
                return
            self._task.cancel()
        self._evaluated.add(canary.version)
        self._task_version = canary.version
        self._task = asyncio.create_task(self._evaluation(canary, live, self.engine.live), name=f"evaluation-{canary.version}")

    def _cancel_evaluation(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _evaluation(self, canary: VersionRecord, live: VersionRecord, live_engine: Engine | None) -> None:
        """Evaluate the loaded candidate against `live` on `live_engine` (None: the candidate engine
        itself) and store the result; an evaluation that raises is stored as failed, with the error as
        its one check."""
        assert self.evaluate is not None
        if await asyncio.to_thread(self.store.evaluation, canary.version) is not None:
            return  # another replica (or an earlier run of this server) evaluated it
        candidate_engine = self.engine.candidate
        if candidate_engine is None or self.engine.candidate_version != canary.version:
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
        await asyncio.to_thread(self.store.record_evaluation, canary.version, *row)
        self.metrics.observe("server/evaluation_seconds", row[3])
        self.metrics.inc("server/evaluations", passed=str(row[1]).lower())
        log.info("version %d evaluated in %.1f s: %s", canary.version, row[3], "passed" if row[1] else "failed")

    async def _evaluate_serving(self) -> None:
        """Immediate mode: evaluate the serving version if it is new, on the candidate engine (no user is
        routed to it in this mode), against itself as the live version (nothing is gated: the bounds
        against the base say how far it moved). The leader's alone."""
        if not self.leader():
            return
        if self.evaluate is None or (self._task is not None and not self._task.done()):
            return
        version = self.engine.version
        if version in self._evaluated:
            return
        record = await asyncio.to_thread(self.store.get_version, version)
        if record is None or record.parent is None:  # the base model: nothing learned to evaluate
            self._evaluated.add(version)
            return
        if await asyncio.to_thread(self.store.evaluation, version) is not None:
            self._evaluated.add(version)
            return
        await self.engine.prepare()
        if not await self.publisher.load_candidate(record):
            return
        self._evaluated.add(version)
        self._task_version = version
        self._task = asyncio.create_task(self._evaluation(record, record, None), name=f"evaluation-{version}")

    # -- what operators see --------------------------------------------------------------------------
    def state(self) -> ReleaseState:
        """The mode, the base lineage's candidate with its traffic against the live version's, its
        evaluation state and the last verdict (blocking: run it off the event loop)."""
        serving = self.engine.version
        canary = self.store.canary_version() if self.mode != "immediate" else None
        candidate = None
        if canary is not None:
            traffic = self.store.version_traffic(True)
            evaluation = self.store.evaluation(canary.version)
            if evaluation is not None:
                state = "passed" if evaluation.passed else "failed"
            elif self._task_version == canary.version and self._task is not None and not self._task.done():
                state = "running"
            else:
                state = "none"
            candidate = CandidateState(
                canary.version, canary.status, self.engine.candidate_version == canary.version,
                traffic.get(canary.version) or VersionTraffic(canary.version, 0, 0, 0),
                traffic.get(serving) or VersionTraffic(serving, 0, 0, 0),
                state, self.decisions.get(canary.version),
            )
        evaluating = self._task_version if self._task is not None and not self._task.done() else None
        return ReleaseState(self.mode, dict(self.config.segments), self.config.canary_fraction, serving, candidate, evaluating)
