"""Weight transport: how a new policy version's tensors reach the engine (the seam of base.py, the
weight types of weights.py, the backends registered in config.py's `BACKENDS`, and the `[transport]`
config). `make_sender` for the learner, `make_receiver` for the server.

Importing this package (or its config) imports no torch: the seam's names load on first use, and a
backend's module only when a deployment chooses it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveloop.transport.config import BACKENDS, TransportConfig

if TYPE_CHECKING:
    from liveloop.transport.base import Receiver, Sender

# the seam's names, each loaded from liveloop.transport.base on first use (it imports torch)
_BASE = (
    "HandleGone", "Receiver", "Sender", "TransportError", "TransportFailed", "TransportMisuse",
    "TransportUnavailable", "WeightHandle", "WeightsUnverified", "byte_view",
)

__all__ = [*_BASE, "BACKENDS", "TransportConfig", "make_receiver", "make_sender"]


def __getattr__(name: str) -> Any:
    if name in _BASE:
        return getattr(importlib.import_module("liveloop.transport.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend(config: TransportConfig) -> Any:
    module = BACKENDS.get(config.backend)
    if module is None:
        raise ValueError(f"unknown transport backend {config.backend!r}")
    return importlib.import_module(module)


def make_sender(
    config: TransportConfig,
    path_for: Callable[[int], Path] | None = None,
    base_model: str | Path | None = None,
    client: Any = None,
) -> Sender:
    """The learner's end. checkpoint_dir needs `path_for(version)` (where the version's policy
    directory goes) and `base_model` (its config.json); nccl needs a vLLM `VLLMWeightSyncClient`."""
    return _backend(config).sender(config, path_for=path_for, base_model=base_model, client=client)


def make_receiver(config: TransportConfig) -> Receiver:
    """The server's end."""
    return _backend(config).receiver(config)
