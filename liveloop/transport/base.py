"""The weight-transport seam: how a learner hands a new version's tensors to an engine in another
process, shaped like vLLM's native weight-transfer protocol.

    sender.init()                       # once: rendezvous, sweep what a crashed sender left
    sender.start_update(version)
    sender.send(named_tensors)          # any number of times (a layer at a time, say)
    handle = sender.finish()            # the version exists for receivers only now
    # (on any error: sender.abort(); nothing of the version is left and nothing was published)

    with receiver.open(handle) as source:        # a WeightSource the engine reads (NamedTensors,
        await engine.update_weights(source, v)   # CheckpointDir); HandleGone if its memory is gone

A `WeightHandle` is small and JSON-serializable; `receiver.handle_for(...)` rebuilds it from a
version's `policy_versions` row. Weights are authenticated: a finished handle carries the attempt's
`nonce` and the tensors' `TensorDigest`, the learner records both in the row, and a receiver verifies
the weights against them before it yields anything (`WeightsUnverified`). The domain errors live in
errors.py (re-exported here). More: docs/transport.md, "The seam".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from liveloop.transport.errors import (  # re-exported: the seam's names
    HandleGone, TransportError, TransportFailed, TransportMisuse, TransportUnavailable, WeightsUnverified,
)
from liveloop.transport.weights import WeightSource

log = logging.getLogger(__name__)


class TensorDigest:
    """The digest a version's row names: sha256 over each tensor in the order given, as its name, dtype,
    shape and the sha256 of its row-major bytes. Sender and receiver feed it the same manifest order;
    names with tied storage are fed once per name (their bytes are equal). Each tensor's bytes are
    hashed on their own, so `update_many` hashes a large state on several threads (hashlib lets go of
    the GIL)."""

    name = "sha256"
    PARALLEL_BYTES = 64 << 20  # below this, threads cost more than they save

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, name: str, dtype: str, shape: list[int] | tuple[int, ...], data: Any) -> None:
        """`data`: a buffer of the tensor's bytes (a memoryview of the mapped file: no copy)."""
        self._add(name, dtype, shape, hashlib.sha256(data).digest())

    def update_many(self, entries: list[tuple[str, str, list[int], Any]]) -> None:
        """`update` for each (name, dtype, shape, data), the bytes hashed in parallel when there are many."""
        workers = min(8, os.cpu_count() or 1)
        if workers > 1 and sum(memoryview(e[3]).nbytes for e in entries) >= self.PARALLEL_BYTES:
            with ThreadPoolExecutor(workers) as pool:
                digests = list(pool.map(lambda e: hashlib.sha256(e[3]).digest(), entries))
        else:
            digests = [hashlib.sha256(e[3]).digest() for e in entries]
        for (name, dtype, shape, _), digest in zip(entries, digests):
            self._add(name, dtype, shape, digest)

    def _add(self, name: str, dtype: str, shape: list[int] | tuple[int, ...], digest: bytes) -> None:
        self._h.update(json.dumps([name, dtype, list(shape)]).encode() + b"\n" + digest)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def new_nonce() -> str:
    """A random nonce for one attempt at sending a version (32 hex characters)."""
    return secrets.token_hex(16)


def require_authenticated(handle: "WeightHandle", where: str) -> None:
    """HandleGone unless the handle (its row) names a nonce and a digest: memory nothing can verify is
    never read (a row from before digests falls back to its durable checkpoint)."""
    if not handle.nonce or not handle.digest:
        raise HandleGone(f"{where}: version {handle.version}'s row names no nonce and digest: its memory is not used")


def verify(handle: "WeightHandle", nonce: str | None, digest: str | None, where: str) -> None:
    """The nonce and digest found at `where` against the handle's (the row's): WeightsUnverified unless
    the handle names both and both match."""
    if not handle.nonce or not handle.digest:
        raise WeightsUnverified(f"{where}: version {handle.version}'s row names no nonce and digest: its weights cannot be verified")
    if not secrets.compare_digest(str(nonce or ""), handle.nonce):
        raise WeightsUnverified(f"{where}: nonce {nonce!r} is not version {handle.version}'s ({handle.nonce})")
    if not secrets.compare_digest(str(digest or ""), handle.digest):
        raise WeightsUnverified(f"{where}: the weights' digest {digest} is not version {handle.version}'s ({handle.digest})")


@dataclass(frozen=True)
class WeightHandle:
    """Where a finished version's weights are: the backend, the version, and the backend's location
    (a checkpoint directory, a shared memory manifest name, ...) with its JSON-able details."""

    backend: str
    version: int
    location: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    nonce: str | None = None  # the sender's nonce for this attempt (the row's `weights_nonce`)
    digest: str | None = None  # the sender's digest of the weights (the row's `weights_digest`)

    def to_json(self) -> str:
        return json.dumps({
            "backend": self.backend, "version": self.version, "location": self.location, "detail": dict(self.detail),
            "nonce": self.nonce, "digest": self.digest,
        })

    @classmethod
    def from_json(cls, text: str) -> "WeightHandle":
        data = json.loads(text)
        return cls(
            str(data["backend"]), int(data["version"]), str(data["location"]), dict(data.get("detail") or {}),
            data.get("nonce"), data.get("digest"),
        )


class Sender:
    """The learner's end: a small state machine (idle -> updating -> idle). `finish` or `abort` ends an
    update, and a failed `send` or `finish` aborts it before raising `TransportFailed`, so a version is
    published only when finish succeeded. Subclasses implement `_start`, `_send`, `_finish` and `_abort`;
    this class keeps the order."""

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

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        """The handle of `version` as its sender finished it, from its row: memory backends derive the
        location from the version, checkpoint_dir from the path; `nonce` and `digest` are the row's
        `weights_nonce` and `weights_digest` (what `open` verifies the weights against)."""
        raise NotImplementedError

    def handle_of(self, record: Any) -> WeightHandle:
        """`handle_for` a version row (a store `VersionRecord`)."""
        return self.handle_for(record.version, record.checkpoint_path, nonce=record.weights_nonce, digest=record.weights_digest)

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        """The weights of `handle`, verified against its nonce and digest, valid inside the block only
        (the engine copies them into its model there). Raises HandleGone when they are not there any
        more, WeightsUnverified when what is there is not what the row names."""
        raise NotImplementedError
        yield  # pragma: no cover

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        """The weights of `handle` as tensors this process owns (copies): for a learner rebuilding a
        durable checkpoint, and for checks. Raises HandleGone."""
        raise NotImplementedError

    def loaded(self, handle: WeightHandle, durable: bool) -> None:
        """`handle`'s version serves now: memory of older versions may go, and its own too once its
        durable checkpoint exists (`durable`). No-op by default."""

    def bell(self) -> Any:
        """Something the server's version watcher can wait on for a co-located learner's publish (an
        object with `async wait(timeout) -> list[int]` and `close()`: liveloop/transport/bell.py), or
        None: this backend rings nothing and the watcher polls."""
        return None

    def close(self) -> None:
        pass


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, flat, in row-major order (for byte-identity checks and copies)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)
