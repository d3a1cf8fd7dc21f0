"""How a learner publishes a version: `VersionPublisher`, which `OnlineLearner` (learner/online.py)
composes as `learner.publishing`. From finite weights only; through the weight transport when there is
one (the store accepts or refuses the number the memory is named by, the row names the handle's nonce
and digest, the durable checkpoint is written after and fsynced before its digest is recorded), else as a
checkpoint saved under a staging name that the store's inserting transaction moves to
checkpoint_dir/vNNNNNN; a full disk pauses learning through the store; retention after each version. A
stale lineage (a rollback or an operator's publish moved the cursor) reloads instead of publishing.

The durable checkpoint of an in-memory version is written on the learner's own thread when it has
nothing to train (`write_durable`, from the loop's idle turns: learner/loop.py), once it has waited
`publish_every_seconds` while ratings keep the learner busy (`write_overdue`: a version's durable write
is bounded under traffic too, so the serving version's parent is a rollback target within about one
publish interval; issue 46.4), or before a third version's host copies are taken (at most
`MAX_PENDING_DURABLE` wait). Every version published in memory, superseded ones included, gets its
durable checkpoint this way (monitor/versions.py `checkpoint`); never from a thread beside the steps,
which held the GIL against them (docs/results/learner_step.md).

Versions coalesce (`[learner] coalesce_versions`): when a publish is due but the next rating is already
waiting (ratings come faster than steps) and the last version is younger than `publish_every_seconds`,
the publish is held back (`hold_back`) and the next step's version supersedes it (`supersede`, counted in
`learner/superseded_versions`); a publish held back for a step that does not come is made by the loop's
next turn (`due`). So nothing queues: not ratings (a step takes what is there, adaptive batching), not
versions the server would swap in only to swap them out, not durable writes.

It needs `Trainee` from the learner and the store's `versions` and `operator` parts."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from liveloop.checkpoint import checkpoint_digest, checkpoint_root, delete_checkpoints, fsync_dir, save_atomically
from liveloop.learner.config import LearnerConfig
from liveloop.learner.position import LearnerState
from liveloop.learner.retention import in_checkpoint_dir, is_disk_full, versions_to_prune
from liveloop.segments import BASE, Lineage
from liveloop.store import StaleLineage, VersionRecord, VersionStatus, VersionTaken
from liveloop.store.operator import OperatorQueries
from liveloop.store.versions import VersionQueries
from liveloop.transport import TransportConfig, TransportFailed, WeightHandle, make_sender

log = logging.getLogger(__name__)

HostState = dict[str, torch.Tensor]
MAX_PENDING_DURABLE = 2  # in-memory versions whose durable checkpoint waits (each holds a host copy of the weights)


class Trainee(Protocol):
    """What publishing needs from the learner (`OnlineLearner` is one)."""

    state: LearnerState  # the position: what was trained since the last version, advanced by a publish
    paused: bool  # a full disk sets it

    def reload(self) -> None:
        """Drop what was trained since the last version and load the version the store's cursor names."""

    def full_policy(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The policy's full weights (gathered across ranks under ZeRO-3) while the context is open."""

    def host_states(self) -> tuple[HostState, HostState | None]:
        """CPU copies of the policy's and the critic's (None: no critic) weights now."""

    def save_policy(self, directory: Path, state: HostState | None = None) -> None:
        """Write the policy (a lane: its adapter) to `directory`: its weights now, or `state`."""

    def save_critic(self, directory: Path, state: HostState | None = None) -> None:
        """Write the critic to `directory` (its weights now, or `state`); nothing when there is none."""


class VersionPublisher:
    """Publishes the learner's versions through the store's `versions` part (and pauses learning through
    its `operator` part on a full disk). The learner replaces its state, weights and critic on a reload,
    so the publisher asks the `Trainee` for them each time and keeps none. What it gives: `due()`,
    `publish()`, `hold_back()` and `supersede()`, `write_durable()`, `wait_durable()`,
    `release_memory()` and `stats()`; it owns the transport's sender, the pending durable checkpoints and
    the list of versions handed over in memory."""

    def __init__(
        self,
        learner: Trainee,
        versions: VersionQueries,
        operator: OperatorQueries,
        config: LearnerConfig,
        cursor_name: str,
        lineage: Lineage = BASE,
        status: VersionStatus = VersionStatus.PUBLISHED,
        transport: TransportConfig | None = None,
        base_model_dir: Path | None = None,
    ):
        self.learner, self.versions, self.operator, self.config = learner, versions, operator, config
        self.cursor_name, self.segment, self.status = cursor_name, lineage.segment, status
        # versions travel to the engine in memory (the durable checkpoint follows) when the transport says
        # so; a lane's adapters stay on checkpoint directories (what engines load adapters from)
        self.sender = None
        # (version, parent, root, policy state, critic state) of in-memory versions not durable yet, oldest first
        self._durable_pending: deque[tuple[int, int, Path, HostState, HostState | None]] = deque()
        self._pending_since: deque[float] = deque()  # when each pending durable checkpoint was deferred (monotonic)
        self._in_memory: list[int] = []  # versions handed over in memory (freed at a clean stop)
        self.held_back = False  # a due publish waits for the next step's version (coalesce_versions)
        self.superseded = 0  # versions held back and then superseded by the next step's
        if transport is not None and transport.in_memory and lineage.is_base:
            self.sender = make_sender(transport, base_model=base_model_dir)
            self.sender.init()

    @property
    def state(self) -> LearnerState:
        return self.learner.state

    def overdue(self) -> bool:
        """`publish_every_seconds` since the last version."""
        return time.monotonic() - self.state.last_publish >= self.config.publish_every_seconds

    def due(self, stepped: bool = True) -> bool:
        """Whether the loop publishes now: steps since the last version and `publish_every_seconds` passed, or
        a publish held back for a next step that did not come (`stepped` False: nothing more to train)."""
        return self.state.steps_since_publish > 0 and (self.overdue() or (self.held_back and not stepped))

    def hold_back(self, waiting: Callable[[], bool]) -> bool:
        """Whether a publish due after a step waits for the next step instead (`coalesce_versions`): it does
        when `waiting()` (a rating past this step's is already there) and the last version is younger than
        `publish_every_seconds`. The loop publishes it if no step follows (`due`)."""
        if not self.config.coalesce_versions or self.overdue() or not waiting():
            return False
        self.held_back = True
        return True

    def supersede(self) -> None:
        """A step starts on top of a held-back publish: that version never is; counted."""
        if self.held_back:
            self.superseded += 1
            self.held_back = False

    def stats(self) -> dict[str, float]:
        return {"learner/superseded_versions": float(self.superseded), "learner/durable_pending": float(len(self._durable_pending))}

    def publish(self) -> int | None:
        """Save the weights and record version v+1 with the cursor; returns the version or None.
        If every step since the last version was skipped, only the cursor moves (no new version)."""
        s = self.state
        self.held_back = False
        with self.learner.full_policy() as policy:
            finite = all(torch.isfinite(p).all() for p in policy.parameters())
        if not finite:
            log.error("not publishing: the policy has non-finite weights")
            s.skipped_steps += 1
            return None
        if s.updates_since_publish == 0:
            try:
                self.versions.advance_cursor(self.cursor_name, s.pending_cursor, s.version)
            except StaleLineage:
                self.learner.reload()
                return None
            s.cursor = s.pending_cursor
            s.steps_since_publish = s.samples_since_publish = 0
            s.last_publish = time.monotonic()
            return None
        if self.sender is not None:
            # memory is named by the version number, so the number comes first: a proposal, which the
            # store's inserting transaction accepts or refuses (VersionTaken: retried at the next publish)
            version = self.versions.next_version()
            return self._publish_in_memory(version, checkpoint_root(self.config.checkpoint_dir, version))
        # the checkpoint is written under a staging name; the store allocates the number inside the
        # inserting transaction, which moves it to checkpoint_dir/vNNNNNN before it commits (`_place`)
        staging = Path(self.config.checkpoint_dir).resolve() / f".staging-{os.getpid()}-{self.cursor_name.replace(':', '-')}"
        try:
            save_atomically(staging, self._write_checkpoint)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._pause_for_disk_full(None, staging, exc)
            return None
        placed: list[Path] = []
        try:
            record = self._record_version(functools.partial(self._place, staging, placed), checkpoint_digest(staging / "policy"))
        except StaleLineage as exc:
            log.warning("not publishing: %s", exc)
            self._discard(staging, *placed)
            self.learner.reload()
            return None
        except Exception as exc:  # the store's database on a full disk
            self._discard(staging, *placed)
            if not is_disk_full(exc):
                raise
            self._pause_for_disk_full(None, staging, exc)
            return None
        version = record.version
        parent = self._advance_to(version)
        log.info("published version %d (step %d, cursor %d)", version, s.step, s.cursor)
        self._apply_retention(protect=(parent, version))
        return version

    def _place(self, staging: Path, placed: list[Path], version: int) -> str:
        """Inside the store's inserting transaction, with `version` allocated: the staged checkpoint
        becomes checkpoint_dir/vNNNNNN (a directory left there by a publish that never committed is
        replaced: no committed version has this number). Returns the policy's path for the row."""
        root = checkpoint_root(self.config.checkpoint_dir, version)
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
        fsync_dir(root.parent)  # the rename is durable before the row that names it commits
        placed.append(root)
        return str(root / "policy")

    @staticmethod
    def _discard(*paths: Path) -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    def _publish_in_memory(self, version: int, root: Path) -> int | None:
        """Publish through the in-memory transport: the tensors are handed over and finished, then the
        version row and the cursor are recorded (naming where the durable checkpoint will be), and the
        server swaps from memory while this writes the durable checkpoint, off the critical path. A
        failed handover publishes nothing: the old version keeps serving and the next publish retries.
        A crash before the durable checkpoint exists is recovered at resume (`position.recover_durable`)."""
        s = self.state
        try:
            with self.learner.full_policy() as policy:
                self.sender.start_update(version)
                self.sender.send(policy.state_dict())
                handle = self.sender.finish()
        except TransportFailed as exc:
            log.warning("version %d not handed over (%s): the old version keeps serving", version, exc)
            return None
        try:  # the row names the handle's nonce and digest: the server verifies the memory against them
            self._record_version(str(root / "policy"), None, version, handle)
        except VersionTaken as exc:  # another writer took the number first: hand over again next time
            log.warning("not publishing version %d: %s", version, exc)
            self.sender.release(version)
            return None
        except StaleLineage as exc:
            log.warning("not publishing version %d: %s", version, exc)
            self.sender.release(version)
            self.learner.reload()
            return None
        except Exception as exc:
            self.sender.release(version)
            if not is_disk_full(exc):
                raise
            self._pause_for_disk_full(version, root, exc)
            return None
        parent = self._advance_to(version)
        # the durable copy, off the critical path: host copies now, written when the learner has nothing to
        # train (the module docstring); at most MAX_PENDING_DURABLE wait
        while len(self._durable_pending) >= MAX_PENDING_DURABLE:
            self.write_durable()
        self._defer_durable(version, parent, root, *self.learner.host_states())
        self._in_memory.append(version)
        log.info("published version %d in memory (step %d, cursor %d)", version, s.step, s.cursor)
        return version

    def _defer_durable(self, version: int, parent: int, root: Path, policy_state: HostState, critic_state: HostState | None) -> None:
        self._durable_pending.append((version, parent, root, policy_state, critic_state))
        self._pending_since.append(time.monotonic())

    def write_durable(self) -> bool:
        """Write the oldest pending durable checkpoint; returns whether one was pending."""
        if not self._durable_pending:
            return False
        self._pending_since.popleft()
        self._write_durable(*self._durable_pending.popleft())
        return True

    def write_overdue(self) -> bool:
        """Write the oldest pending durable checkpoint if it has waited `publish_every_seconds` (the loop's
        turns call it whether or not the learner is busy: under steady ratings it never idles, and the
        serving version's parent would stay in memory only, which a rollback cannot read once the server
        freed it). Under steady traffic this writes no more checkpoints than before (one a version), only
        sooner. Returns whether it wrote one."""
        if not self._pending_since or time.monotonic() - self._pending_since[0] < self.config.publish_every_seconds:
            return False
        return self.write_durable()

    def _write_durable(
        self, version: int, parent: int, root: Path, policy_state: HostState, critic_state: HostState | None
    ) -> None:
        """The deferred half of an in-memory publish: the checkpoint directory, its digest, retention.
        A full disk pauses learning (the memory stays: the transport keeps it until the server holds a
        durable copy, and a resume recovers from it); never raises."""
        try:
            save_atomically(root, functools.partial(self._write_checkpoint, policy_state=policy_state, critic_state=critic_state))
            self.versions.set_checkpoint_digest(version, checkpoint_digest(root / "policy"))
        except Exception as exc:
            if is_disk_full(exc):
                self._pause_for_disk_full(version, root, exc)
            else:
                log.exception("version %d: the durable checkpoint was not written (a resume recovers it from memory)", version)
            return
        self._apply_retention(protect=(parent, version))

    def wait_durable(self) -> None:
        """Write every pending durable checkpoint of an in-memory publish now."""
        while self.write_durable():
            pass

    def release_memory(self) -> None:
        """At a clean stop, with every durable checkpoint written: free the memory this learner's versions
        still hold (a server that has not swapped them in yet reads their checkpoints instead)."""
        if self.sender is None:
            return
        for version in self._in_memory:
            self.sender.release(version)
        self._in_memory.clear()

    def _advance_to(self, version: int) -> int:
        """The learner now descends from `version`, just published with the pending cursor; returns
        the version it descended from before."""
        s = self.state
        parent = s.version
        s.version, s.cursor = version, s.pending_cursor
        s.steps_since_publish = s.samples_since_publish = s.updates_since_publish = 0
        s.last_publish = time.monotonic()
        return parent

    def _record_version(
        self, checkpoint: str | Callable[[int], str], digest: str | None, version: int | None = None, handle: WeightHandle | None = None
    ) -> VersionRecord:
        """The version row and the cursor, in one store transaction. `version` None: the store allocates
        the number and `checkpoint(number)` places the checkpoint and names it; else a proposed number
        (VersionTaken if it is taken) with the checkpoint's path."""
        s = self.state
        metrics = dict(s.last_metrics) | {"learner/superseded_versions": float(self.superseded), "learner/step": s.step, "learner/samples": s.samples, "learner/cursor": s.pending_cursor}
        if handle is not None and "bytes" in handle.detail:  # what the transport shipped for this version (delta: vs full)
            metrics |= {"transport/bytes": handle.detail["bytes"], "transport/full_bytes": handle.detail.get("full_bytes", handle.detail["bytes"])}
        return self.versions.publish_version(
            version,
            parent=s.version,
            checkpoint_path=checkpoint,
            checkpoint_sha256=digest,
            learner_step=s.step,
            samples_used=s.samples_since_publish,
            metrics=metrics,
            cursor_name=self.cursor_name,
            last_feedback_id=s.pending_cursor,
            status=self.status,
            segment=self.segment,
            weights_nonce=handle.nonce if handle is not None else None,
            weights_digest=handle.digest if handle is not None else None,
        )

    def _write_checkpoint(
        self, tmp: Path, policy_state: HostState | None = None, critic_state: HostState | None = None
    ) -> None:
        """Write policy and critic into `tmp`: their weights now, or the given states (host copies an
        in-memory publish took); a failed write removes what it had written (a full disk must not stay
        full of half a checkpoint)."""
        try:
            self.learner.save_policy(tmp / "policy", policy_state)
            self.learner.save_critic(tmp / "critic", critic_state)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _pause_for_disk_full(self, version: int | None, root: Path, exc: BaseException) -> None:
        """Out of disk: pause learning through the store (the server keeps serving the current
        version) and log a "disk_full" operator event. What was trained since the last version stays
        in memory and the store's cursor does not move, so nothing is lost: the next publish after an
        operator frees space and resumes carries it (a restart trains those ratings again)."""
        s = self.state
        what = "the next version" if version is None else f"version {version}"
        reason = f"disk full: could not save {what} under {root.parent}: {exc}"
        log.error("pausing learning: %s", reason)
        self.learner.paused = True
        detail = {
            "learner": self.cursor_name,
            "path": str(root.parent),
            "error": str(exc),
            "unpublished_version": version,
            "unpublished_samples": s.samples_since_publish,
            "cursor": s.cursor,
            "pending_cursor": s.pending_cursor,
        }
        try:
            self.operator.record_event("disk_full", version=s.version, detail=detail)
            self.operator.set_learning_paused(self.cursor_name, True, reason=reason)
        except Exception:  # the store may sit on the same full disk: keep running, retry at the next publish
            log.exception("could not record the disk-full pause in the store")

    def _apply_retention(self, protect: tuple[int, ...]) -> None:
        """Delete the checkpoints retention no longer keeps: marked pruned in the store first (so
        nothing tries to serve them), then their directories go. Never raises: housekeeping must not
        fail a publish that already happened."""
        c = self.config
        try:
            versions = [r for r in self.versions.list_versions() if r.segment == self.segment]
            owned = {r.version for r in versions if in_checkpoint_dir(r, c.checkpoint_dir)}
            victims = [v for v in versions_to_prune(versions, c.keep_last_versions, c.keep_parent_chain, protect) if v in owned]
            pruned = self.versions.mark_pruned(victims) if victims else []
        except Exception:
            log.exception("checkpoint retention skipped")
            return
        if pruned:
            gone = delete_checkpoints(c.checkpoint_dir, pruned)
            log.info("retention: pruned the checkpoints of versions %s", gone)
