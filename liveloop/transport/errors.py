"""The transport's domain errors, in a leaf that imports no torch: the private shared-memory directory
(private_dir.py) and the `[transport]` config raise and catch them without loading the seam.
liveloop/transport/base.py re-exports them with the seam.
"""

from __future__ import annotations


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


class WeightsUnverified(TransportError):
    """The weights found for a handle are not the ones its row names (another nonce, another digest,
    a file that is not ours): nothing of them may serve."""
