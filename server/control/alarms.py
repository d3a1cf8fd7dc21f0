"""Reward-hacking alarms on the live stream (`[release.alarms]`; the operator's view: docs/operations.md,
"Reward-hacking alarms"), run by `Operations.watch_alarms` every `check_seconds` in a worker thread: for
each lineage (the base weights', each segment's adapters) the serving version, and the gate's CANARY
candidate when there is one, are judged by monitor/hacking.py on their rated replies (texts decoded from
`store.release.rated_tokens`), against a reference stretch of the lineage (`RewardHackingAlarms.check`).

An alarm (a trait explaining at least `explained_share` of a gain of at least `min_gain`, significant)
is recorded once per version and trait: an operator event `reward_hacking` with the report, the
version's stored evaluation of the same traits ("versus the evaluation": does the gain show on the
evaluation suite, or only in the live ratings?) and the `monitor/reward_hacking` metric. With
`auto_hold` it also holds a CANARY candidate (`store.versions.hold_version`: the gate's next pass drops it
from the candidate engine) and pauses the lineage's learning (the serving version is the guard's and the
operator's to roll back). The latest judgement of each version is kept for `GET /admin/alarms`.

In a fleet only the leader judges (server/control/operations.py `watch_alarms`; server/control/leader.py):
the other replicas' `GET /admin/alarms` show the recorded events but no judgements of their own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from liveloop.metrics import Metrics
from liveloop.monitor.hacking import HackingReport, alarms, attribute
from liveloop.release.config import AlarmConfig
from liveloop.segments import BASE, Lineage
from liveloop.server.control.activator import Activator
from liveloop.store import TransitionRefused, VersionRecord
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.records import VersionTraffic
from liveloop.store.release import ReleaseQueries
from liveloop.store.versions import VersionQueries

log = logging.getLogger(__name__)

MAX_SAMPLE = 2000  # ratings per side of a judgement, the newest
KEPT = 64  # judgements kept for the admin view (the newest versions)
EVALUATION_CHECKS = ("flattery", "sycophancy", "length", "repetition")  # besides every reward:<spec> check


@dataclass(frozen=True)
class HackingVerdict:
    """One judgement: a version (`role` "serving" or "candidate") against its reference, the report,
    the traits that alarm, and its stored evaluation of the same traits (None: not evaluated)."""

    version: int
    lineage: Lineage
    role: str
    versions: tuple[int, ...]  # whose ratings make the version's sample (it, pooled with its nearest ancestors)
    reference: tuple[int, ...]  # whose ratings make the reference's
    report: HackingReport
    alarms: tuple[str, ...]
    evaluation: dict[str, Any] | None
    judged_at: float  # unix seconds
    held: bool = False  # auto_hold held this candidate
    paused: bool = False  # auto_hold paused the lineage's learning

    def detail(self) -> dict[str, Any]:
        """The operator event's (and the route's) JSON."""
        return {
            "version": self.version, "segment": self.lineage.segment, "role": self.role, "versions": list(self.versions),
            "reference": list(self.reference), "alarms": list(self.alarms), "report": self.report.as_dict(),
            "evaluation": self.evaluation, "judged_at": self.judged_at, "held": self.held, "paused": self.paused,
        }


def lineage_chain(version: int, by_number: dict[int, VersionRecord]) -> list[int]:
    """`version` and its ancestors in its lineage (same segment), newest first."""
    chain: list[int] = []
    record = by_number.get(version)
    segment = record.segment if record is not None else None
    while record is not None and record.segment == segment and record.version not in chain:
        chain.append(record.version)
        record = by_number.get(record.parent) if record.parent is not None else None
    return chain


def stretch(
    order: Sequence[int], traffic: dict[int, VersionTraffic], need: int, taken: Collection[int] = ()
) -> tuple[int, ...] | None:
    """The versions of `order` (skipping `taken`), in order, whose ratings first add up to `need`;
    None when they never do."""
    out, n = [], 0
    for v in order:
        if v in taken:
            break  # the two sides never interleave
        out.append(v)
        n += traffic[v].ratings if v in traffic else 0
        if n >= need:
            return tuple(out)
    return None


class RewardHackingAlarms:
    def __init__(
        self, config: AlarmConfig, activator: Activator, metrics: Metrics, tokenizer: Any, *,
        feedback: FeedbackQueries, versions: VersionQueries, operator: OperatorQueries, release: ReleaseQueries,
    ):
        self.config = config
        self.feedback, self.versions, self.operator, self.release = feedback, versions, operator, release
        self.activator = activator
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.verdicts: dict[int, HackingVerdict] = {}
        self._seen: dict[int, tuple] = {}  # version -> the ratings counts it was last judged on
        self._alarmed: set[tuple[int, str]] | None = None  # (version, trait) already recorded (read back at the first check)
        self._looked: tuple | None = None  # the newest rating and the versions of the last pass

    def reset(self) -> None:
        """Forget what was judged and recorded: the next check re-reads the recorded alarms from the store
        (a replica that becomes the fleet's leader: its predecessor recorded alarms meanwhile)."""
        self._alarmed, self._looked = None, None
        self._seen.clear()

    # -- one pass -------------------------------------------------------------------------------
    def check(self, term: int | None = None) -> list[HackingVerdict]:
        """Judge every lineage's serving version and CANARY candidate whose ratings changed since it was
        last judged; record new alarms, as the leader of `term` (None: unfenced). Runs in a worker
        thread. Returns this pass's judgements. Raises StaleLeader when no longer the leader of `term`
        (its hold carries the term, store/lease.py `fenced`: the pass ends before it pauses or records
        anything, and the new leader judges again).

        What a version is compared with: the CANARY candidate, its own ratings against the live
        (serving) version's; the serving version, its ratings against its lineage's root (the base
        model, version 0, or the segment's first adapter): "how much of what the learning gained since
        the base is a cheap trait". Against its parent instead, a learner that publishes every few
        seconds would compare two stretches of one slow drift and never see it. A side with fewer than
        `min_ratings` ratings of its own is pooled with its nearest versions along the lineage (the
        judged version's ancestors, newest first; the root's descendants, oldest first: `stretch`) until
        it has them, never sharing a version with the other side; with too few in all nothing is judged.
        At most `MAX_SAMPLE` ratings per side, the newest."""
        if self._alarmed is None:
            self._alarmed = {
                (e.version, e.detail.get("trait")) for e in self.operator.events(limit=10000) if e.kind == "reward_hacking"
            }
        lineages: list[tuple[Lineage, int | None]] = [(BASE, self.activator.serving_version)]
        lineages += [(Lineage(segment), v) for segment, v in self.activator.serving_adapters().items()]
        canaries = {lineage: self.versions.canary_version(lineage.segment) for lineage, _ in lineages}
        # the per-version aggregate scans the ratings: only when there are new ones or the versions changed
        looked = (self.feedback.last_rating_id(), tuple(lineages), tuple(c.version if c else None for c in canaries.values()))
        if looked == self._looked:
            return []
        self._looked = looked
        by_number = {v.version: v for v in self.versions.list_versions()}
        traffic = self.release.version_traffic(True)  # quarantined keys' ratings left out, as the guard reads
        done = []
        for lineage, serving in lineages:
            canary = canaries[lineage]
            if serving is not None and serving in by_number:
                chain = lineage_chain(serving, by_number)
                mine = stretch(chain, traffic, self.config.min_ratings)
                if mine is not None:
                    root = stretch(chain[::-1], traffic, self.config.min_ratings, set(mine))
                    if root is not None:
                        done += self._judge(serving, lineage, "serving", mine, root, traffic, term)
            if canary is not None and serving is not None and serving in by_number:
                mine = stretch([canary.version], traffic, self.config.min_ratings)
                live = stretch(lineage_chain(serving, by_number), traffic, self.config.min_ratings, {canary.version})
                if mine is not None and live is not None:
                    done += self._judge(canary.version, lineage, "candidate", mine, live, traffic, term)
        return done

    def _judge(
        self, version: int, lineage: Lineage, role: str, mine: tuple[int, ...], reference: tuple[int, ...],
        traffic: dict[int, VersionTraffic], term: int | None,
    ) -> list[HackingVerdict]:
        seen = (role, tuple((v, traffic[v].ratings) for v in mine + reference if v in traffic))
        if self._seen.get(version) == seen:
            return []
        self._seen[version] = seen
        c = self.config
        report = attribute(self._sample(mine), self._sample(reference), c.traits, c.flattery_words, c.agreement_words)
        raised = tuple(alarms(report, c.min_gain, c.explained_share))
        verdict = HackingVerdict(version, lineage, role, mine, reference, report, raised, self._evaluation(version), time.time())
        for t in report.traits:
            if t.share is not None:
                self.metrics.set("monitor/hacking_share", t.share, trait=t.trait, role=role)
        self.metrics.set("monitor/hacking_gain", report.gain, role=role)
        assert self._alarmed is not None
        new = [trait for trait in raised if (version, trait) not in self._alarmed]
        if new:
            verdict = self._act(verdict, new, term)
        self.verdicts[version] = verdict
        for old in sorted(self.verdicts)[:-KEPT]:
            del self.verdicts[old]
        return [verdict]

    def _act(self, verdict: HackingVerdict, new: list[str], term: int | None) -> HackingVerdict:
        """Record the new alarms (once per version and trait); with auto_hold, hold a candidate (fenced
        by `term`: StaleLeader leaves before anything is written) and pause the lineage's learning."""
        reason = f"reward hacking: {', '.join(new)} explain the {verdict.role} version's gain"
        held = paused = False
        if self.config.auto_hold:
            lane = self.activator.lane(verdict.lineage)
            if verdict.role == "candidate":
                try:
                    self.versions.hold_version(verdict.version, reason, lane, {"alarms": new, "report": verdict.report.as_dict()}, term)
                    held = True
                    self.metrics.inc("server/release_held")  # as the gate counts its holds (no labels: one family)
                except TransitionRefused as exc:  # the gate decided first (promoted, held, superseded)
                    log.info("reward hacking: version %d could not be held: %s", verdict.version, exc)
            paused = self.operator.set_learning_paused(lane, True, reason)
            verdict = replace(verdict, held=held, paused=paused)
        for trait in new:
            t = verdict.report.trait(trait)
            detail = {"trait": trait, "share": t.share, "explained": t.explained, "effect": t.effect, "z": t.z} | verdict.detail()
            self.operator.record_event("reward_hacking", verdict.version, detail)
            self.metrics.inc("monitor/reward_hacking", trait=trait, role=verdict.role)
            assert self._alarmed is not None
            self._alarmed.add((verdict.version, trait))
            log.warning(
                "reward hacking: %s version %d: %s explains %.0f%% of its reward gain %+.3f over %s%s",
                verdict.role, verdict.version, trait, 100 * (t.share or 0), verdict.report.gain, list(verdict.reference),
                " (held)" if held else "",
            )
        return verdict

    # -- reads ----------------------------------------------------------------------------------
    def _sample(self, versions: tuple[int, ...]) -> list[tuple[str, int]]:
        """The rated replies of `versions` as (text, reward), at most MAX_SAMPLE, the first versions first."""
        rows: list[tuple[list[int], int]] = []
        for v in versions:
            if len(rows) >= MAX_SAMPLE:
                break
            rows += self.release.rated_tokens(v, MAX_SAMPLE - len(rows))
        texts = self.tokenizer.batch_decode([ids for ids, _ in rows], skip_special_tokens=True)
        return [(text, reward) for text, (_, reward) in zip(texts, rows)]

    def _evaluation(self, version: int) -> dict[str, Any] | None:
        """The version's stored evaluation of the traits the live stream is judged on: each reward:<spec>
        check and EVALUATION_CHECKS with its value, the live version's and the base's, and whether it
        passed; None when the version has no evaluation."""
        record = self.release.evaluation(version)
        if record is None:
            return None
        checks = {
            c["name"]: {k: c.get(k) for k in ("value", "live", "base", "passed")}
            for c in record.checks
            if str(c.get("name", "")).startswith("reward:") or c.get("name") in EVALUATION_CHECKS
        }
        return {"version": version, "live_version": record.live_version, "passed": record.passed, "checks": checks}
