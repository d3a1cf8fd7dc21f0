"""The `[transport]` section: how a new policy version's weights travel from the learner to the engine.

    [transport]
    backend = "shared_memory"    # checkpoint_dir | shared_memory | ipc | nccl | delta
    namespace = "auto"           # this deployment's private directory (auto: its random id, from the store)
    keep_versions = 2            # memory backends: versions whose memory may stay alive at once
    bell = true                  # shared_memory: the learner wakes the co-located servers' watchers at a publish

`checkpoint_dir` is today's path (a directory on disk; works across machines and is itself durable).
`shared_memory` hands tensors to a co-located CPU engine through POSIX shared memory. `ipc` (same GPU,
CUDA IPC handles) and `nccl` (other GPUs) follow vLLM's weight-transfer backends of the same names.
`delta` ships what changed since the previous version through a directory replicas on other machines read.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from liveloop.config_types import check_literals
from liveloop.transport.private_dir import namespace_unavailable

log = logging.getLogger(__name__)

Backend = Literal["checkpoint_dir", "shared_memory", "ipc", "nccl", "delta"]
# The one registry of backends: each name is the module `liveloop.transport.<name>`, imported only when a
# deployment chooses it; the module defines `sender(config, path_for=, base_model=, client=)` and
# `receiver(config)` (`liveloop.transport.make_sender` / `make_receiver`). A new backend is a module and
# its name here.
BACKENDS: dict[str, str] = {name: f"liveloop.transport.{name}" for name in get_args(Backend)}

# a directory name under /dev/shm/liveloop-<uid>/
_NAMESPACE = re.compile(r"[A-Za-z0-9_]{1,16}")
# the backends whose weights (or mailboxes) live in the deployment's private /dev/shm directory
_IN_SHARED_MEMORY = frozenset({"shared_memory", "ipc"})
# addresses that bind every interface: never the nccl rendezvous's
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*", "[::]"})


@dataclass(frozen=True)
class TransportConfig:
    backend: Backend = field(
        default="checkpoint_dir",
        metadata={"help": "checkpoint_dir (disk, any machine) | shared_memory (co-located CPU engine) | ipc (same GPU) | nccl (other GPUs) "
                          "| delta (changed bytes, through a directory other machines read)"},
    )
    namespace: str = field(
        default="auto",
        metadata={"help": "this deployment's private shared-memory directory; the learner and the server must use the same "
                  "(letters, digits, _; at most 16); auto: the deployment's random id, which the store's migration "
                  "generates, so deployments on one machine never mix (whatever their store URLs)"},
    )
    keep_versions: int = field(
        default=2, metadata={"help": "memory backends: at most this many versions' memory alive at once (older ones are removed)"}
    )
    bell: bool = field(
        default=True,
        metadata={"help": "shared_memory: the learner rings the co-located servers when a version's memory is finished, so "
                  "they look for it at once (liveloop/transport/bell.py); false: they find it at their next [server] "
                  "watch_seconds poll"},
    )
    durable_wait_seconds: float = field(
        default=60.0,
        metadata={"help": "server: how long a published version whose memory is gone may wait for its durable checkpoint before the server gives up on it"},
    )
    packed: bool = field(default=True, metadata={"help": "ipc/nccl: send tensors packed into fixed buffers (vLLM's `packed`)"})
    packed_buffer_size_bytes: int = field(default=1 << 30, metadata={"help": "ipc/nccl: the size of one packed buffer"})
    packed_num_buffers: int = field(default=2, metadata={"help": "nccl: packed buffers in flight"})
    master_address: str = field(default="127.0.0.1", metadata={"help": "nccl: the TCPStore rendezvous address: the learner's rank 0 listens on it alone, the workers connect to it (a wildcard is refused)"})
    master_port: int = field(default=29555, metadata={"help": "nccl: the TCPStore rendezvous port"})
    world_size: int = field(default=2, metadata={"help": "nccl: the learner's sender plus every inference worker"})
    delta_dir: str = field(
        default="", metadata={"help": "delta: the directory every machine reads (a shared filesystem or an object store's mount) "
                              "holding each version's delta against its parent and its manifest"}
    )
    delta_max_chain: int = field(
        default=8, metadata={"help": "delta: a full copy after this many deltas in a row (the longest chain a receiver applies)"}
    )
    delta_chunk_bytes: int = field(
        default=4096, metadata={"help": "delta: a changed tensor ships the chunks of this many bytes that differ (a multiple of 8)"}
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"namespace: {self.namespace!r} must be 1 to 16 letters, digits or _")
        if self.keep_versions < 1:
            raise ValueError(f"keep_versions: must be at least 1, got {self.keep_versions}")
        if self.durable_wait_seconds < 0:
            raise ValueError(f"durable_wait_seconds: must be >= 0, got {self.durable_wait_seconds}")
        if self.packed_buffer_size_bytes < 1 << 20:
            raise ValueError(f"packed_buffer_size_bytes: must be at least 1 MiB, got {self.packed_buffer_size_bytes}")
        if self.packed_num_buffers < 1:
            raise ValueError(f"packed_num_buffers: must be at least 1, got {self.packed_num_buffers}")
        if self.master_address.strip() in _WILDCARDS:
            raise ValueError(
                f"master_address: {self.master_address!r} would listen on every interface; the learner's rank 0 "
                "binds the nccl rendezvous to this address, so name one the workers reach (127.0.0.1 on one machine)"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port: {self.master_port} is not a port")
        if self.world_size < 2:
            raise ValueError(f"world_size: nccl needs the sender and at least one worker, got {self.world_size}")
        if self.backend == "delta" and not self.delta_dir:
            raise ValueError("delta_dir: the delta backend needs the directory its versions are written to")
        if self.delta_max_chain < 1:
            raise ValueError(f"delta_max_chain: must be at least 1, got {self.delta_max_chain}")
        if self.delta_chunk_bytes < 8 or self.delta_chunk_bytes % 8:
            raise ValueError(f"delta_chunk_bytes: must be a positive multiple of 8, got {self.delta_chunk_bytes}")

    def for_deployment(self, store_url: str) -> "TransportConfig":
        """This config with an "auto" namespace replaced by the deployment's random id, read from the
        (migrated) store at `store_url`: never derived from the URL itself, which two checkouts on the
        default relative SQLite URL share. Then `runnable_here`: checkpoint_dir where its shared memory
        cannot be had."""
        if self.namespace != "auto":
            return self.runnable_here()
        from liveloop.store import Store, StoreConfig

        store = Store(StoreConfig(url=store_url))
        try:
            ident = store.fleet.deployment_id()
        finally:
            store.close()
        return replace(self, namespace=f"d{ident[:15]}").runnable_here()

    def unusable_here(self) -> str | None:
        """Why this backend's shared memory (its private /dev/shm directory; ipc's mailboxes live there
        too) cannot be had on this machine; None when it can or the backend needs none."""
        if self.backend not in _IN_SHARED_MEMORY:
            return None
        return namespace_unavailable(self.namespace)

    def runnable_here(self) -> "TransportConfig":
        """This config, or the checkpoint_dir backend when `unusable_here` says why not (every name under
        /dev/shm taken by another user: a start that others cannot break). The server and its learner
        resolve alike; the server records the fallback (server/control/startup.py `record_fallback`)."""
        why = self.unusable_here()
        if why is None:
            return self
        log.error("transport: %s cannot run here (%s): versions travel through checkpoint directories", self.backend, why)
        return replace(self, backend="checkpoint_dir")

    @property
    def in_memory(self) -> bool:
        """Whether the weights travel outside the durable checkpoint (which the learner then writes after)."""
        return self.backend != "checkpoint_dir"
