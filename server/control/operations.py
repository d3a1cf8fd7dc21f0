"""What operators act on and watch, in the server: learning pause/resume, rollback (through the
activator), and the drift monitor loop, which reads new ratings every poll, records alarms as
operator events, exports the figures as Prometheus metrics and, when `[monitor] guard` is on, rolls
back a serving version whose reward rate is significantly below its parent's; the keys' disagreement
scores, and when `[monitor] quarantine_z` is set, the automatic quarantine of keys above it that at
least `quarantine_corroborating_keys` other keys side against. Quarantined keys' ratings are left out
of the drift monitor, the per-version rates (the version table, its metrics and the guard's decisions)
and the consensus.

An operator's weights (`publish_weights`, `POST /admin/weights`) are copied into the learner's
checkpoint_dir and checked there (server/control/weights_import.py), then published; an import that does
not end up serving leaves nothing behind.

The reward-hacking alarms (`[release.alarms]`, server/control/alarms.py) run in their own loop,
`watch_alarms`, every `check_seconds`, when the wiring gives `alarms` and the tokenizer. The learner's
pace and its behind / refused-step alarms (server/control/learner_watch.py) run in `watch_pace`, which
the wiring starts once the learner is there (it reads the learner's status).

In a fleet every replica runs these loops, but only the leader (`leader`: the term of the store's leader
lease this replica holds, None when it does not; server/control/leader.py) writes: the drift alarms, the
guard's rollbacks, the automatic quarantine and the reward-hacking alarms; the other replicas still read
the ratings and export the figures. A new leader re-reads which alarms are recorded already.

Results are typed (`LearningState`, `WeightsImported`, `RollbackResult`, `VersionRow`, `KeyRow`,
`HackingVerdict`, `LearnerPace`); the admin routes turn them into JSON."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.drift import ALL, DriftMonitor, RaisedAlarm
from liveloop.monitor.guard import Tally, judge
from liveloop.monitor.poisoning import Disagreement, ReplyGroups, Suspect, find_suspects
from liveloop.monitor.versions import VersionRow, version_table
from liveloop.release.config import AlarmConfig
from liveloop.segments import BASE, Lineage
from liveloop.server.control.alarms import HackingVerdict, RewardHackingAlarms
from liveloop.server.control.activator import Activator
from liveloop.server.control.outcomes import RollbackResult, SwapResult
from liveloop.server.control.learner_watch import LearnerPace, LearnerWatch, StatusView
from liveloop.server.control.weights_import import WeightImports
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.keys import KeyQueries, KeyState
from liveloop.store.lease import StaleLeader
from liveloop.store.operator import OperatorQueries
from liveloop.store.release import ReleaseQueries
from liveloop.store.versions import ServingChanged, VersionQueries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearningState:
    """A learner's pause switch after an operator's pause or resume (`changed`: it was flipped)."""

    learner: str
    paused: bool
    changed: bool
    lineage: Lineage = BASE  # one segment's adapter lineage (base: the whole learner)


@dataclass(frozen=True)
class WeightsImported:
    """An operator's checkpoint serving: the swap, the copy's digest (its row's checkpoint_sha256), the
    files taken from the serving model and the files of the operator's directory not copied."""

    swap: SwapResult
    checkpoint_sha256: str
    completed: tuple[str, ...]
    left_behind: tuple[str, ...]


@dataclass(frozen=True)
class KeyRow:
    """One API key as operators see it, with its disagreement score (None: no rating with a consensus)."""

    state: KeyState
    disagreement: Disagreement | None


class Operations:
    def __init__(
        self, config: MonitorConfig, activator: Activator, metrics: Metrics, imports: WeightImports | None = None, *,
        feedback: FeedbackQueries, versions: VersionQueries, operator: OperatorQueries, release: ReleaseQueries, keys: KeyQueries,
        alarms: AlarmConfig | None = None, tokenizer: Any = None, leader: Callable[[], int | None] | None = None,
        max_step_kl: float = 0.0,
    ):
        self.config = config
        # the leader lease's term this replica holds now, None when another replica leads (server/control/leader.py);
        # without one (a lone Operations) it always leads
        self.leader: Callable[[], int | None] = leader or (lambda: 0)
        self._alarms_term: int | None = None  # the term the alarms last ran in
        # the store's parts, private: `versions` and `keys` are the operator's views below
        self._feedback, self._versions, self._operator, self._release, self._keys = feedback, versions, operator, release, keys
        self.activator = activator
        self.metrics = metrics
        self.imports = imports  # where operators' weights are copied to (None: POST /admin/weights is off)
        self._importing: set[asyncio.Task] = set()
        self.monitor = DriftMonitor(config, feedback)
        self._replayed = False
        self._guarded: set[int] = set()  # versions the guard already judged worse (acted once)
        # the reply grouping of the key scores, remembered between scorings (new replies cost, old
        # ones do not); one scoring at a time (the loop's and the keys page's threads)
        self._groups = ReplyGroups(config.similarity)
        self._scoring = threading.Lock()
        # reward-hacking alarms (None: off, or no tokenizer to read the replies with)
        self.alarms = (
            RewardHackingAlarms(
                alarms, activator, metrics, tokenizer, feedback=feedback, versions=versions, operator=operator, release=release,
            )
            if alarms and alarms.enabled and tokenizer else None
        )
        # the learner's pace: its lanes are the segments' with adapters, else the one of the whole policy
        lanes = [(lineage, activator.lane(lineage)) for lineage in activator.lanes()]
        self.pace = LearnerWatch(config, feedback, operator, metrics, lanes, max_step_kl)

    @property
    def learner_name(self) -> str:
        return self.activator.learner_name

    # -- actions -------------------------------------------------------------------------------
    async def set_paused(
        self, paused: bool, api_key_id: str | None, reason: str | None = None, lineage: Lineage = BASE
    ) -> LearningState:
        """Pause or resume the learner, or one segment's lane (it neither trains nor activates; the
        others go on). Raises the activator's UnknownSegment."""
        name = self.activator.lane(lineage)
        changed = await asyncio.to_thread(self._operator.set_learning_paused, name, paused, reason, api_key_id)
        if lineage.is_base:
            self.metrics.set("learner/paused", float(paused))
        else:
            self.metrics.set("learner/segment_paused", float(paused), segment=lineage.segment)
        return LearningState(name, paused, changed, lineage)

    async def paused(self, lineage: Lineage = BASE) -> bool:
        return await asyncio.to_thread(self._operator.learning_paused, self.activator.lane(lineage))

    async def rollback(
        self, version: int, api_key_id: str | None, reason: str | None = None, lineage: Lineage | None = None,
        expect_serving: int | None = None,
    ) -> RollbackResult:
        return await self.activator.rollback(version, api_key_id, reason, lineage, expect_serving)

    async def publish_weights(self, path: str, note: str | None = None, api_key_id: str | None = None) -> WeightsImported:
        """Serve the checkpoint in the operator's directory `path` from a checked copy in managed storage
        (server/control/weights_import.py), as the next version and the learner's lineage. Runs to its end even if
        the caller goes away (a half-done import would leave a LOADING row). Raises the import's
        ImportRefused / ImportFailed, the activator's CheckpointUnusable, the store's TransitionRefused."""
        assert self.imports is not None, "the wiring gives Operations its WeightImports"
        task = asyncio.ensure_future(self._import(path, note, api_key_id))
        self._importing.add(task)
        task.add_done_callback(self._importing.discard)
        return await asyncio.shield(task)

    async def _import(self, path: str, note: str | None, api_key_id: str | None) -> WeightsImported:
        imports = self.imports
        assert imports is not None
        start = time.perf_counter()
        staged = await asyncio.to_thread(imports.stage, path)
        try:
            swapped = await self.activator.activate_import(staged, note=note)
        except BaseException:
            await asyncio.to_thread(staged.abandon, self._versions)
            raise
        detail = {"source": path, "bytes": staged.size, "completed": list(staged.completed), "left_behind": list(staged.left_behind)}
        try:  # it serves already: a store that cannot take the event costs the record, not the answer
            await asyncio.to_thread(self._operator.record_event, "weights_imported", swapped.version, detail, api_key_id)
        except Exception:
            log.exception("version %d: the weights_imported event was not recorded", swapped.version)
        self.metrics.observe("server/import_seconds", time.perf_counter() - start)
        log.info("imported %s as version %d (%d bytes; from the serving model: %s)", path, swapped.version, staged.size, staged.completed)
        return WeightsImported(swapped, staged.digest, staged.completed, staged.left_behind)

    # -- views ---------------------------------------------------------------------------------
    async def versions(self) -> list[VersionRow]:
        """The version table: the store's rows and the engine's serving versions, read between two
        changes of what serves (server/control/settled.py), so the two agree."""
        async def read() -> list[VersionRow]:
            versions = await asyncio.to_thread(self._versions.list_versions)
            traffic = await asyncio.to_thread(self._release.version_traffic, True)  # quarantined keys left out
            return version_table(versions, traffic, self.activator.serving_version, self.config.confidence, self.activator.serving_adapters())

        return await self.activator.changes.settled(read)

    # -- keys -----------------------------------------------------------------------------------
    def _scores(self) -> tuple[list[KeyState], dict[str, Disagreement], list[Suspect]]:
        states = self._keys.key_states()
        excluded = {k.key_id for k in states if k.quarantined}
        c = self.config
        ratings = self._keys.key_ratings()
        with self._scoring:
            scores, found = find_suspects(
                ratings, c.quarantine_z, c.quarantine_min_ratings, c.quarantine_corroborating_keys,
                exclude_from_consensus=excluded, similarity=c.similarity, groups=self._groups,
            )
        return states, {d.key_id: d for d in scores}, found

    async def keys(self) -> list[KeyRow]:
        states, scores, _ = await asyncio.to_thread(self._scores)
        return [KeyRow(k, scores.get(k.key_id)) for k in states]

    def quarantine_suspects(self, term: int | None = None) -> list[str]:
        """Quarantine every key whose disagreement z passes `quarantine_z`, corroborated by
        `quarantine_corroborating_keys` distinct other keys (runs in a worker thread), as the leader of
        `term` (None: unfenced): a deposed leader's quarantine is refused (StaleLeader) and stops the pass."""
        states, _, found = self._scores()
        done = []
        quarantined = {k.key_id for k in states if k.quarantined}
        for suspect in found:
            d, again = suspect.score, suspect.corroborated
            if d.key_id in quarantined:
                continue
            reason = (
                f"automatic: disagreement z = {d.z:.1f} over {d.n} ratings (threshold {self.config.quarantine_z}); "
                f"z = {again.z:.1f} over {again.n} without its {len(suspect.left_out)} top accusers"
            )
            if self._keys.set_quarantined(d.key_id, True, reason, None, term=term or None):
                self.metrics.inc("monitor/quarantined")
                log.warning("quarantined key %s: %s", d.key_id, reason)
                done.append(d.key_id)
        return done

    # -- the monitor loop ----------------------------------------------------------------------
    def poll(self) -> list[RaisedAlarm]:
        """Read new ratings (replaying the newest ones quietly on the first call); record and count
        the alarms they raise; export the figures. Runs in a worker thread."""
        replay = not self._replayed
        raised = self.monitor.catch_up(replay=replay)
        self._replayed = True
        if replay:
            raised = []  # alarms of replayed ratings were recorded when they were first seen
        term = self.leader()
        if term is None:
            raised = []  # the leader records them
        for alarm in raised:
            try:  # fenced: a leader deposed since it read the ratings records nothing (the new one does)
                self._operator.record_event("alarm", alarm.policy_version, alarm.as_dict(), term=term or None)
            except StaleLeader as exc:
                log.warning("drift alarm not recorded: %s", exc)
                break
            self.metrics.inc("monitor/alarms", segment=alarm.segment, direction=alarm.alarm.direction)
            log.warning("drift alarm: %s", alarm.as_dict())
        overall = self.monitor.detectors[ALL]
        self.metrics.set("monitor/drift_up", overall.up)
        self.metrics.set("monitor/drift_down", overall.down)
        series = self.monitor.series()
        if series:
            self.metrics.set("monitor/reward_rate_window", series[-1].reward.value)
        return raised

    def export_versions(self, rows: list[VersionRow]) -> None:
        for row in rows:
            if row.reward.n:
                self.metrics.set("monitor/reward_rate", row.reward.value, version=str(row.version))
            self.metrics.set("monitor/ratings", row.reward.n, version=str(row.version))

    async def guard(self, rows: list[VersionRow]) -> RollbackResult | None:
        """Roll each lineage's serving version back to its parent if it is significantly worse: the
        base weights', and each segment's adapter whose parent is an adapter of the same segment (a
        segment's first adapter is not judged against the base, whose ratings come from every segment).
        Returns the base lineage's rollback, else the first segment's, else None."""
        by_version = {r.version: r for r in rows}
        lineages = [(BASE, self.activator.serving_version)]
        lineages += [(Lineage(segment), v) for segment, v in self.activator.serving_adapters().items() if v is not None]
        done = None
        for lineage, version in lineages:
            result = await self._guard_lineage(by_version, version, lineage)
            done = done or result
        return done

    async def _guard_lineage(self, by_version: dict[int, VersionRow], version: int, lineage: Lineage) -> RollbackResult | None:
        serving = by_version.get(version)
        if serving is None or serving.parent is None or serving.version in self._guarded:
            return None
        parent = by_version.get(serving.parent)
        if parent is None or not parent.status.servable or Lineage.of(parent) != lineage:
            return None
        verdict = judge(
            serving.version, serving.parent, tally_of(serving), tally_of(parent),
            self.config.guard_min_ratings, self.config.guard_min_keys, self.config.guard_p_value,
        )
        if verdict is None:
            return None
        self._guarded.add(verdict.version)
        where = "the base" if lineage.is_base else f"segment {lineage.segment}'s"
        log.warning("guard: %s version %d is significantly worse than %d: rolling back", where, verdict.version, verdict.parent)
        detail = verdict.as_dict() | ({} if lineage.is_base else {"segment": lineage.segment})
        term = self.leader()
        if term is None:
            return None
        try:  # compare-and-set: only if what it judged still serves (an operator's import or rollback since wins),
            # fenced: only while this replica still leads in the term it judged in
            return await self.activator.rollback(
                verdict.parent, None, f"guard: {verdict.as_dict()}", lineage, expect_serving=verdict.version,
                event=("guard_rollback", detail), term=term or None,
            )
        except (ServingChanged, StaleLeader) as exc:
            self._guarded.discard(verdict.version)  # not decided: judged again by whoever leads next
            log.info("guard: not rolling back version %d: %s", verdict.version, exc)
            return None

    # -- reward-hacking alarms ------------------------------------------------------------------
    def hacking(self) -> list[HackingVerdict]:
        """The latest judgement of each recently judged version, newest version first."""
        if self.alarms is None:
            return []
        return [self.alarms.verdicts[v] for v in sorted(self.alarms.verdicts, reverse=True)]

    async def check_alarms(self) -> list[HackingVerdict]:
        """One pass of the reward-hacking alarms (off the event loop); [] when they are off."""
        if self.alarms is None:
            return []
        term = self.leader()
        return await asyncio.to_thread(self.alarms.check, term or None)

    async def watch_alarms(self) -> None:
        """Judge the live stream every `[release.alarms] check_seconds` while this replica leads, until
        cancelled (returns at once when the alarms are off)."""
        if self.alarms is None:
            return
        while True:
            try:
                term = self.leader()
                if term is not None:
                    if term != self._alarms_term:  # newly the leader: what the one before recorded counts
                        self.alarms.reset()
                    await self.check_alarms()
                self._alarms_term = term
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reward-hacking alarms")
            await asyncio.sleep(self.alarms.config.check_seconds)

    # -- the learner's pace ---------------------------------------------------------------------
    def learner_pace(self) -> LearnerPace | None:
        """Every lane's pace at the last check (None: not measured yet, or no learner to watch)."""
        return self.pace.latest

    async def check_pace(self, status: Callable[[], StatusView], now: float | None = None) -> LearnerPace:
        """One look at the learner's lanes (off the event loop): `status()` is the learner's (when it does
        not answer, the store's cursors stand in); `now`: unix seconds, the clock's by default."""
        try:
            current: StatusView | None = await asyncio.to_thread(status)
        except Exception as exc:  # restarting, busy, gone: the store still knows its published cursor
            log.debug("learner pace: the learner did not answer: %s", exc)
            current = None
        term = self.leader()
        return await asyncio.to_thread(self.pace.check, current, time.time() if now is None else now, term)

    async def watch_pace(self, status: Callable[[], StatusView]) -> None:
        """Measure the learner's pace every `[monitor] learner_check_seconds` until cancelled."""
        while True:
            try:
                await self.check_pace(status)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("learner pace")
            await asyncio.sleep(self.config.learner_check_seconds)

    async def run(self) -> None:
        """Poll until cancelled."""
        self.metrics.set("learner/paused", float(await self.paused()))
        exported_at, exported_id = 0.0, -1
        while True:
            try:
                await asyncio.to_thread(self.poll)
                # the per-version aggregate scans the ratings: only when there are new ones, and at
                # most every 5 polls
                now = time.monotonic()
                if self.monitor.last_id != exported_id and now - exported_at >= 5 * self.config.poll_seconds:
                    exported_at, exported_id = now, self.monitor.last_id
                    rows = await self.versions()
                    self.export_versions(rows)
                    term = self.leader()
                    if self.config.guard and term is not None:
                        await self.guard(rows)
                    if self.config.quarantine_z > 0 and term is not None:
                        try:
                            await asyncio.to_thread(self.quarantine_suspects, term)
                        except StaleLeader as exc:
                            log.warning("quarantine pass stopped: %s", exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("drift monitor")
            await asyncio.sleep(self.config.poll_seconds)


def tally_of(row: VersionRow) -> Tally:
    return Tally(row.reward.n, row.reward.successes, row.keys, row.votes)
