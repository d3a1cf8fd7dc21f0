"""Forget that reaches the weights (`POST /admin/keys/{key_id}/forget` with `weights: true`; the operator's
view: docs/operations.md, "Forgetting a key, weights included").

A plain forget deletes a key's responses and ratings (store/rights.py); the versions already trained on
them keep what they learned. With `weights` each lineage the learner trains (the base weights', or each
segment adapter's when `[segments] adapters` is on; the frozen base then has no learner) is also moved back
to before the key's first trained rating and trained again from there on everyone else's ratings.

`plan_forget` makes the `ForgetPlan` (reads only; per lineage `plan_lineage`: the key's first rating it
read, the first version that can have trained it, the rollback target before it, the ratings replayed and
an estimate of how long). A dry run returns it and changes nothing. Otherwise `Forgetting.forget` deletes
the key's data as a plain forget does, then per affected lineage moves the learner's cursor back and rolls
the lineage back to the target (`Forgetting._roll_back`), and records an operator event `forget_weights`.
The learner trains the ratings after the target's position again, without the key's, as a new lineage of
versions from the target, each through the release gate of the lineage's mode like any other version. A
lineage the key never rated is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from liveloop.segments import Lineage
from liveloop.server.control.activator import Activator
from liveloop.server.control.outcomes import AlreadyServing, RollbackResult
from liveloop.store import VersionRecord
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.rights import Deleted, KeyNotFound, RightsQueries
from liveloop.store.status import NOT_ROLLED_BACK
from liveloop.store.versions import VersionQueries
from liveloop.transport.checkpoint_dir import is_checkpoint

log = logging.getLogger(__name__)

THROUGHPUT_VERSIONS = 10  # the lineage's newest versions whose rows measure the learner's rate


@dataclass(frozen=True)
class LineagePlan:
    """What a forget does to one lineage. `target` None: nothing to roll back (the key never trained it)."""

    lane: str  # the learner cursor of the lineage (`sao`, `sao:cozy`)
    lineage: Lineage
    first_rating: int | None  # the key's earliest rating this lineage reads
    first_trained: int | None  # the first version whose training reached it
    head: int | None  # the learner's cursor version (its lineage's newest)
    head_cursor: int  # the learner's feedback position
    target: int | None  # the version served again, the retraining's parent
    target_cursor: int  # the target's feedback position: ratings after it are trained again
    affected: tuple[int, ...] = ()  # the lineage's versions after the target (they become rolled back)
    skipped: tuple[int, ...] = ()  # newer candidates for the target whose checkpoint is gone or that cannot serve
    replay: int = 0  # everyone else's ratings trained again
    samples_per_second: float | None = None  # the rate the lineage's recent versions consumed ratings
    estimate_seconds: float | None = None  # replay / samples_per_second
    in_memory: bool = False  # no version trained the key yet, but the learner may have in unpublished steps


@dataclass(frozen=True)
class ForgetPlan:
    key_id: str
    responses: int  # the key's responses and ratings a forget deletes
    ratings: int
    lineages: tuple[LineagePlan, ...]

    @property
    def affected(self) -> tuple[LineagePlan, ...]:
        return tuple(p for p in self.lineages if p.target is not None)

    @property
    def estimate_seconds(self) -> float | None:
        """The lanes train one after another's steps on one learner: their estimates add up."""
        known = [p.estimate_seconds for p in self.affected if p.estimate_seconds is not None]
        return sum(known) if known else (0.0 if not self.affected else None)


@dataclass(frozen=True)
class LineageDone:
    lane: str
    lineage: Lineage
    target: int
    rolled_back: tuple[int, ...]
    swapped: bool  # the engine swapped to the target (False: it served already)
    resumed: bool  # the lane learns again (False: the operator had paused it)


@dataclass(frozen=True)
class ForgetResult:
    plan: ForgetPlan
    dry_run: bool
    deleted: Deleted | None = None
    done: tuple[LineageDone, ...] = field(default_factory=tuple)


def as_json(item: LineagePlan | LineageDone) -> dict[str, Any]:
    """A lineage's plan or outcome as the admin API's JSON: its lineage as `segment`, the segment's name
    (None: the base weights')."""
    return {("segment" if k == "lineage" else k): (item.lineage.segment if k == "lineage" else v) for k, v in dataclasses.asdict(item).items()}


def _cursor_of(record: VersionRecord) -> int | None:
    value = record.metrics.get("learner/cursor") if record.metrics else None
    return int(value) if isinstance(value, (int, float)) else None


def _chain(versions: dict[int, VersionRecord], head: int, lineage: Lineage) -> tuple[list[VersionRecord], VersionRecord | None]:
    """The lineage's versions from its root to `head` (oldest first), and, for a segment, the base
    version its first adapter grew on (None when the chain does not reach one)."""
    chain: list[VersionRecord] = []
    seen: set[int] = set()
    at: int | None = head
    root_base = None
    while at is not None and at in versions and at not in seen:
        seen.add(at)
        record = versions[at]
        if Lineage.of(record) != lineage:
            root_base = record
            break
        chain.append(record)
        at = record.parent
    return chain[::-1], root_base


def _servable(record: VersionRecord) -> bool:
    if not record.status.servable or record.pruned_at is not None or not record.checkpoint_path:
        return False
    return record.version == 0 or is_checkpoint(record.checkpoint_path)


def _throughput(versions: list[VersionRecord]) -> float | None:
    """Ratings per second the lineage's newest versions consumed: their samples over the time between
    the first and the last of them (None with fewer than two, or no time between them)."""
    learned = sorted((r for r in versions if _cursor_of(r) is not None), key=lambda r: r.version)[-THROUGHPUT_VERSIONS:]
    if len(learned) < 2:
        return None
    span = (learned[-1].created_at - learned[0].created_at).total_seconds()
    samples = sum(r.samples_used for r in learned[1:])
    return samples / span if span > 0 and samples > 0 else None


def plan_lineage(
    rights: RightsQueries, versions: VersionQueries, feedback: FeedbackQueries, key_id: str, lane: str, lineage: Lineage,
    rows: dict[int, VersionRecord],
) -> LineagePlan:
    """One lineage's part of a forget (reads only):
    - the key's first rating that lineage reads (`rights.key_first_rating`, planned before anything
      is deleted);
    - the first version of the lineage's chain (from the learner's cursor version back through the
      parents) whose recorded feedback position (`learner/cursor` in its row's metrics; an operator's
      import inherits its parent's) reached that rating: the first version that can have trained it;
    - the rollback target: the newest older version on that chain that can still serve (servable status,
      not pruned, its checkpoint on disk), else the lineage's root (version 0, or for a segment the base
      weights with no adapter); versions passed over for a missing checkpoint are reported (`skipped`);
    - the ratings replayed: everyone else's trainable ratings between the target's position and the
      learner's cursor (`rights.replay_count`), and the estimate: those over the rate the lineage's
      recent versions consumed ratings (their `samples_used` over the time between them). That rate is
      what the learner was fed, not what it can do: an upper bound when ratings came slowly.

    Ratings trained but not yet published: when the key's first rating comes after the head's feedback
    position, no version trained it, but the learner may hold it in steps it has not published (at most
    `[learner] publish_every_steps`; a separate `liveloop learn` process cannot be asked). The plan is
    then made as if the head had trained it (`in_memory`): the target is the newest servable version
    before the head, so the cursor's version changes and the learner reloads, dropping its unpublished
    steps; the head's own ratings are everyone else's and are trained again. The one case left: a lineage
    whose head is still its root (it never published); its first version may carry those steps."""
    segment = lineage.segment  # the store's filters take the segment's name
    first = rights.key_first_rating(key_id, segment)
    head = versions.cursor_version(lane)
    head_cursor = feedback.get_cursor(lane)
    nothing = LineagePlan(lane, lineage, first, None, head, head_cursor, None, head_cursor)
    if first is None or head is None or head not in rows:
        return nothing
    chain, root_base = _chain(rows, head, lineage)
    cursors, running = [], 0
    for record in chain:  # an import (no cursor of its own) carries its parent's position
        own = _cursor_of(record)
        running = max(running, own) if own is not None else running
        cursors.append(running)
    trained = next((i for i, c in enumerate(cursors) if c >= first and chain[i].version != 0), None)
    in_memory = trained is None and first > head_cursor and len(chain) > 1
    if in_memory:  # the learner may hold it in steps it has not published: reloading drops them
        trained = len(chain) - 1
    elif trained is None:
        return nothing
    skipped: list[int] = []
    target, target_cursor = None, 0
    for i in range(trained - 1, -1, -1):
        if _servable(chain[i]):
            target, target_cursor = chain[i].version, cursors[i]
            break
        skipped.append(chain[i].version)
    if target is None:  # the lineage's root: the base model (version 0), or a segment's base weights
        if lineage.is_base:
            target = 0
        else:
            serving_base = versions.latest_version()
            target = serving_base.version if serving_base is not None else (root_base.version if root_base is not None else 0)
    own = [r for r in rows.values() if r.segment == segment]
    affected = tuple(sorted(r.version for r in own if r.version > target and r.status not in NOT_ROLLED_BACK))
    replay = rights.replay_count(target_cursor, head_cursor, segment, excluding=key_id)
    rate = _throughput(own)
    return LineagePlan(
        lane, lineage, first, None if in_memory else chain[trained].version, head, head_cursor, target, target_cursor, affected,
        tuple(skipped), replay, rate, replay / rate if rate else None, in_memory,
    )


def plan_forget(
    rights: RightsQueries, versions: VersionQueries, feedback: FeedbackQueries, key_id: str, lanes: list[tuple[str, Lineage]],
) -> ForgetPlan:
    """The plan for every lineage a learner trains (`lanes`: (cursor name, lineage)). Raises KeyNotFound
    when the store knows nothing of the key."""
    if not rights.key_known(key_id):
        raise KeyNotFound(f"no key {key_id} in the store (no response, rating or operator decision)")
    responses, ratings = rights.key_rows(key_id)
    rows = {r.version: r for r in versions.list_versions()}
    plans = tuple(plan_lineage(rights, versions, feedback, key_id, lane, lineage, rows) for lane, lineage in lanes)
    return ForgetPlan(key_id, responses, ratings, plans)


class Forgetting:
    """Plans and runs forgets that reach the weights, through the store and the activator."""

    def __init__(
        self, activator: Activator, *, rights: RightsQueries, versions: VersionQueries, feedback: FeedbackQueries, operator: OperatorQueries,
    ):
        self.activator = activator
        self.rights, self.versions, self.feedback, self.operator = rights, versions, feedback, operator
        self._lock = asyncio.Lock()  # one forget at a time moves cursors

    def lanes(self) -> list[tuple[str, Lineage]]:
        """The lineages a learner trains: each segment's adapters, or the base weights without adapters."""
        return [(self.activator.lane(lineage), lineage) for lineage in self.activator.lanes()]

    async def plan(self, key_id: str) -> ForgetPlan:
        return await asyncio.to_thread(plan_forget, self.rights, self.versions, self.feedback, key_id, self.lanes())

    async def forget(self, key_id: str, dry_run: bool, admin_key_id: str | None = None) -> ForgetResult:
        """Dry run: the plan. Else the key's data deleted, then each affected lineage rolled back to its
        target with the learner's cursor moved back, and an operator event `forget_weights`."""
        async with self._lock:
            plan = await self.plan(key_id)
            if dry_run:
                return ForgetResult(plan, True)
            deleted = await asyncio.to_thread(self.rights.forget_key, key_id, admin_key_id)
            done = []
            for lineage in plan.affected:
                done.append(await self._roll_back(lineage, key_id, admin_key_id))
            result = ForgetResult(plan, False, deleted, tuple(done))
            detail = {
                "key_id": key_id, "responses": deleted.responses, "ratings": deleted.ratings,
                "lineages": [
                    {"lane": d.lane, "segment": d.lineage.segment, "target": d.target, "rolled_back": list(d.rolled_back), "resumed": d.resumed}
                    for d in done
                ],
                "replay": sum(p.replay for p in plan.affected),
                "estimate_seconds": plan.estimate_seconds,
            }
            await asyncio.to_thread(self.operator.record_event, "forget_weights", None, detail, admin_key_id)
            return result

    async def _roll_back(self, plan: LineagePlan, key_id: str, admin_key_id: str | None) -> LineageDone:
        """The lane paused (unless the operator had paused it), the learner's cursor pointed at the target
        AND moved back to its feedback position in one version-state transaction
        (`rights.rewind_lineage`: a publish on the old lineage racing it is refused by the lineage
        check; the paused learner reloads the target and trains nothing meanwhile), then
        `Activator.rollback` serves the target and marks every later version of the lineage rolled back
        (when the target serves already, the store's `rollback_to` alone marks them); then the lane
        resumed. If the rollback fails the cursor is put back."""
        assert plan.target is not None
        lane = plan.lane
        reason = f"forget key {key_id}: retrain from version {plan.target} without it"
        was_paused = await asyncio.to_thread(self.operator.learning_paused, lane)
        if not was_paused:
            await asyncio.to_thread(self.operator.set_learning_paused, lane, True, reason, admin_key_id)
        try:
            before = await asyncio.to_thread(self.rights.rewind_lineage, lane, plan.target, plan.target_cursor)
            swapped = True
            try:
                result: RollbackResult = await self.activator.rollback(plan.target, admin_key_id, reason, plan.lineage)
                rolled = tuple(result.rolled_back)
            except AlreadyServing:  # the target serves already: only the versions after it move
                swapped = False
                rolled = tuple(await asyncio.to_thread(self.versions.rollback_to, plan.target, lane, admin_key_id, reason, plan.lineage.segment))
            except BaseException:
                if before[0] is not None:  # nothing rolled back: the learner goes on where it was
                    await asyncio.to_thread(self.rights.rewind_lineage, lane, before[0], before[1])
                raise
        finally:
            if not was_paused:
                await asyncio.to_thread(self.operator.set_learning_paused, lane, False, reason, admin_key_id)
        log.warning("forget %s: lineage %s rolled back to version %d (rolled back: %s), retraining after rating %d",
                    key_id, lane, plan.target, list(rolled), plan.target_cursor)
        return LineageDone(lane, plan.lineage, plan.target, rolled, swapped, not was_paused)
