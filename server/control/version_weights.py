"""Where a version's weights come from before it serves here, always verified against its row: one place
for activation, rollback, the watcher and the gate's candidates (server/control/activator.py and beside it).

Weights come through the transport seam (liveloop/transport): with a `receiver`, a published base version
is read from memory first (the learner sent it before recording the row, and writes the durable
checkpoint after, off the critical path), then from its checkpoint directory. Memory is verified by its
nonce and digest, a checkpoint by its sha256 (liveloop/transport/base.py); on a mismatch nothing swaps
(WeightsUnverified). A checkpoint directory is verified by copying it (`verified_copy`: every file,
config and tokenizer included, hashed as it is copied into a private directory) and the engine loads that
copy, removed after the swap: never the shared directory again. A version whose memory is gone and whose
durable checkpoint is not written yet waits, up to `durable_wait_seconds` (`gave_up`). After a swap the
receiver frees the memory of older versions, and the new version's own once its durable checkpoint
exists (`loaded`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from liveloop.segments import Lineage
from liveloop.store import VersionRecord
from liveloop.transport import HandleGone, Receiver, WeightHandle
from liveloop.transport.checkpoint_dir import is_checkpoint, verified_copy
from liveloop.transport.weights import CheckpointDir, WeightSource

log = logging.getLogger(__name__)


def being_written(record: VersionRecord) -> bool:
    """A base version published in memory whose durable checkpoint its learner has not finished: the row
    records the checkpoint's digest only once it is written and fsynced."""
    return Lineage.of(record).is_base and bool(record.weights_digest) and not record.checkpoint_sha256


class VersionWeights:
    """Finds a version's verified weights, waits for a durable checkpoint being written, and tells the
    transport what it may free."""

    def __init__(self, receiver: Receiver | None, durable_wait_seconds: float, keep_serving_memory: bool):
        self.receiver = receiver  # the transport's end (None: checkpoint directories only)
        self.durable_wait_seconds = durable_wait_seconds
        self.keep_serving_memory = keep_serving_memory  # other replicas still read the serving version's memory
        self._waiting: dict[int, float] = {}  # version -> when its weights were first found missing

    def find(self, record: VersionRecord, stack: contextlib.ExitStack, memory: bool = True) -> tuple[WeightSource | None, str, WeightHandle | None]:
        """The version's weights, verified against its row (WeightsUnverified): for the base lineage its
        transport's memory first (`memory`), then its durable checkpoint; a segment's adapter from its
        checkpoint. What a checkpoint gives is its verified private copy, removed when `stack` closes.
        (None, ...) when nothing is there yet. A durable base checkpoint counts once the row names its
        digest (an in-memory publish records it after fsync); version 0 with no digest is the configured
        model's own directory."""
        found = self._find(record, stack, memory)
        if found[0] is not None:
            self._waiting.pop(record.version, None)
        return found

    def _find(self, record: VersionRecord, stack: contextlib.ExitStack, memory: bool) -> tuple[WeightSource | None, str, WeightHandle | None]:
        lineage = Lineage.of(record)
        if lineage.is_base and memory and self.receiver is not None:
            try:
                handle = self.handle(record)
                return stack.enter_context(self.receiver.open(handle)), self.receiver.backend, handle
            except HandleGone as exc:
                log.debug("version %d: %s; trying its checkpoint directory", record.version, exc)
        path = record.checkpoint_path
        if path and (not lineage.is_base or is_checkpoint(path)):
            if being_written(record):
                return None, "", None
            copy = stack.enter_context(verified_copy(path, record.checkpoint_sha256, record.version))
            return CheckpointDir(copy.path), "checkpoint_dir", None  # the copy that was hashed, removed with `stack`
        if record.version == 0 and path:  # the configured model's directory
            return CheckpointDir(Path(path)), "checkpoint_dir", None
        return None, "", None

    def handle(self, record: VersionRecord) -> WeightHandle:
        assert self.receiver is not None
        return self.receiver.handle_of(record)  # the row's nonce and digest: what `open` verifies against

    def gave_up(self, record: VersionRecord) -> bool:
        """Its memory is gone and its durable checkpoint not written yet: wait (the learner writes it
        after the swap would have happened; False), up to durable_wait_seconds; past them True (logged:
        its learner died before writing it, and the learner's resume rolls its lineage back)."""
        first = self._waiting.setdefault(record.version, time.monotonic())
        waited = time.monotonic() - first
        if waited < self.durable_wait_seconds:
            if waited == 0:
                log.warning("version %d: no weights in memory nor at %s yet; waiting for its checkpoint", record.version, record.checkpoint_path)
            return False
        self._waiting.pop(record.version, None)
        log.error("version %d: no weights after %.0f s (its learner died before writing %s?): marked FAILED", record.version, waited, record.checkpoint_path)
        return True

    async def loaded(self, record: VersionRecord, handle: WeightHandle | None) -> None:
        """The transport may free what no replica needs now that `record` serves here: older versions'
        memory, and its own once durable (kept while other replicas may still read it: with
        `keep_serving_memory`, the next version's `loaded`, or the sender's `keep_versions`, frees it)."""
        if self.receiver is None or not Lineage.of(record).is_base:
            return
        durable = not self.keep_serving_memory and await asyncio.to_thread(is_checkpoint, record.checkpoint_path or "")
        await asyncio.to_thread(self.receiver.loaded, handle or self.handle(record), durable)
