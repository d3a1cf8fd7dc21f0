"""The weight-transport seam: how a learner hands a new version's tensors to an engine in another
process, shaped like vLLM's native weight-transfer protocol.

    sender.init()                       # once: rendezvous, sweep what a crashed sender left
    sender.start_update(version)
    sender.send(named_tensors)          # any number of times (a layer at a time, say)
    handle = sender.finish()            # the version exists for receivers only now
    # (on any error: sender.abort(); nothing of the version is left and nothing was published)

    with receiver.open(handle) as source:        # a WeightSource the engine reads (NamedTensors,
        await engine.update_weights(source, v)   # CheckpointDir); HandleGone if its memory is gone

A `WeightHandle` is small and JSON-serializable; `receiver.handle_for(version, checkpoint_path)` rebuilds
it from what the store already knows (memory backends name their memory after the version), so a
server finds a version's memory from its `policy_versions` row alone.

A sender is a small state machine (idle -> updating -> idle): `finish` or `abort` ends an update, and a
failed `send` or `finish` aborts it before raising `TransportFailed`, so a version is published only
when finish succeeded. Backends supply `_start`, `_send`, `_finish` and `_abort`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from liveloop.server.engines.base import WeightSource

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """Base of the transport's domain errors."""


class TransportFailed(TransportError):
    """An update could not be sent or finished: it was aborted, nothing of it was published."""


class TransportMisuse(TransportError):
    """A call out of order: send before start_update, two updates at once, finish twice."""


class HandleGone(TransportError):
    """A handle whose weights are no longer there (memory released, superseded, never committed, or
    another machine): the receiver falls back to the version's durable checkpoint."""


class TransportUnavailable(TransportError):
    """The backend cannot run here (no GPU, no vLLM, no /dev/shm)."""


@dataclass(frozen=True)
class WeightHandle:
    """Where a finished version's weights are: the backend, the version, and the backend's location
    (a checkpoint directory, a shared memory manifest name, ...) with its JSON-able details."""

    backend: str
    version: int
    location: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"backend": self.backend, "version": self.version, "location": self.location, "detail": dict(self.detail)})

    @classmethod
    def from_json(cls, text: str) -> "WeightHandle":
        data = json.loads(text)
        return cls(str(data["backend"]), int(data["version"]), str(data["location"]), dict(data.get("detail") or {}))


class Sender:
    """The learner's end. Subclasses implement the four `_` hooks; this class keeps the order."""

    backend = "?"
    durable = False  # whether a finished handle is itself the durable checkpoint (checkpoint_dir)

    def __init__(self) -> None:
        self._version: int | None = None
        self._initialized = False

    @property
    def updating(self) -> int | None:
        """The version being sent, or None between updates."""
        return self._version

    def init(self) -> None:
        """Prepare once (rendezvous; remove what a sender that crashed mid-update left behind)."""
        self._init()
        self._initialized = True

    def start_update(self, version: int) -> None:
        if not self._initialized:
            self.init()
        if self._version is not None:
            raise TransportMisuse(f"start_update({version}): version {self._version} is still being sent (finish or abort it)")
        if version < 0:
            raise TransportMisuse(f"start_update: version must be >= 0, got {version}")
        try:
            self._start(version)
        except Exception as exc:
            self._abort_quietly(version)
            raise TransportFailed(f"{self.backend}: could not start version {version}: {exc}") from exc
        self._version = version

    def send(self, tensors: Mapping[str, torch.Tensor]) -> None:
        version = self._require_update("send")
        try:
            self._send(version, tensors)
        except Exception as exc:
            self.abort()
            raise TransportFailed(f"{self.backend}: sending version {version} failed (aborted): {exc}") from exc

    def finish(self) -> WeightHandle:
        version = self._require_update("finish")
        try:
            handle = self._finish(version)
        except Exception as exc:
            self.abort()
            raise TransportFailed(f"{self.backend}: finishing version {version} failed (aborted): {exc}") from exc
        self._version = None
        return handle

    def abort(self) -> None:
        """Drop the update in progress and everything it had sent (no-op between updates)."""
        if self._version is None:
            return
        version, self._version = self._version, None
        self._abort_quietly(version)

    def release(self, version: int) -> None:
        """The durable checkpoint of `version` exists now: its memory may go (no-op by default)."""

    def close(self) -> None:
        self.abort()

    def _require_update(self, what: str) -> int:
        if self._version is None:
            raise TransportMisuse(f"{what}: no update started (call start_update first)")
        return self._version

    def _abort_quietly(self, version: int) -> None:
        try:
            self._abort(version)
        except Exception:  # abort runs on error paths: never hide the first error
            log.exception("%s: aborting version %d left something behind", self.backend, version)

    # -- what a backend supplies -----------------------------------------------------------------------
    def _init(self) -> None:
        pass

    def _start(self, version: int) -> None:
        raise NotImplementedError

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def _finish(self, version: int) -> WeightHandle:
        raise NotImplementedError

    def _abort(self, version: int) -> None:
        raise NotImplementedError


class Receiver:
    """The engine's end: a handle back into a `WeightSource`."""

    backend = "?"

    def handle_for(self, version: int, checkpoint_path: str | None = None) -> WeightHandle:
        """The handle of `version` as its sender would have finished it (memory backends derive it from
        the version; checkpoint_dir from the path the version row records)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        """The weights of `handle`, valid inside the block only (the engine copies them into its model
        there). Raises HandleGone when they are not there any more."""
        raise NotImplementedError
        yield  # pragma: no cover

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        """The weights of `handle` as tensors this process owns (copies): for a learner rebuilding a
        durable checkpoint, and for checks. Raises HandleGone."""
        raise NotImplementedError

    def loaded(self, handle: WeightHandle, durable: bool) -> None:
        """`handle`'s version serves now: memory of older versions may go, and its own too once its
        durable checkpoint exists (`durable`). No-op by default."""

    def close(self) -> None:
        pass


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, flat, in row-major order (for byte-identity checks and copies)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)
