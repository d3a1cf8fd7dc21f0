"""Weight transport: how a new policy version's tensors reach the engine (the seam of base.py, its
backends, and the `[transport]` config). `make_sender` for the learner, `make_receiver` for the server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from liveloop.transport.base import (
    HandleGone,
    Receiver,
    Sender,
    TransportError,
    TransportFailed,
    TransportMisuse,
    TransportUnavailable,
    WeightHandle,
    WeightsUnverified,
    byte_view,
)
from liveloop.transport.config import TransportConfig

__all__ = [
    "HandleGone", "Receiver", "Sender", "TransportConfig", "TransportError", "TransportFailed", "TransportMisuse",
    "TransportUnavailable", "WeightHandle", "WeightsUnverified", "byte_view", "make_receiver", "make_sender",
]


def make_sender(
    config: TransportConfig,
    path_for: Callable[[int], Path] | None = None,
    base_model: str | Path | None = None,
    client: Any = None,
) -> Sender:
    """The learner's end. checkpoint_dir needs `path_for(version)` (where the version's policy
    directory goes) and `base_model` (its config.json); nccl needs a vLLM `VLLMWeightSyncClient`."""
    match config.backend:
        case "checkpoint_dir":
            if path_for is None:
                raise ValueError("checkpoint_dir transport: path_for is required")
            from liveloop.transport.checkpoint_dir import CheckpointDirSender

            return CheckpointDirSender(path_for, base_model)
        case "shared_memory":
            from liveloop.transport.shared_memory import SharedMemorySender

            return SharedMemorySender(config.namespace, config.keep_versions)
        case "ipc":
            from liveloop.transport.ipc import IpcSender

            return IpcSender(config.namespace, config.keep_versions)
        case "nccl":
            if client is None:
                raise ValueError("nccl transport: a vLLM weight-sync client is required")
            from liveloop.transport.nccl import NcclSender

            return NcclSender(config, client)
    raise ValueError(f"unknown transport backend {config.backend!r}")


def make_receiver(config: TransportConfig) -> Receiver:
    """The server's end."""
    match config.backend:
        case "checkpoint_dir":
            from liveloop.transport.checkpoint_dir import CheckpointDirReceiver

            return CheckpointDirReceiver()
        case "shared_memory":
            from liveloop.transport.shared_memory import SharedMemoryReceiver

            return SharedMemoryReceiver(config.namespace)
        case "ipc":
            from liveloop.transport.ipc import IpcReceiver

            return IpcReceiver(config.namespace)
        case "nccl":
            from liveloop.transport.nccl import NcclReceiver

            return NcclReceiver()
    raise ValueError(f"unknown transport backend {config.backend!r}")
