"""The `nccl` backend: the learner on one GPU broadcasts a new version to inference workers on other
GPUs, vLLM's `nccl` weight-transfer backend (vllm/distributed/weight_transfer/nccl_engine.py).

NOT RUN HERE: this machine has no GPU (and the GPU machine has no vLLM). What runs and is tested on CPU:
the configuration's translation into vLLM's typed init and update infos (`trainer_init_info`,
`worker_init_info`, `update_info`, validated by vLLM's own dataclasses) and the sender's ordering.

NCCL is a push: the sender and the engine's workers meet inside the same collective calls, so there is
no handle to open later. `NcclSender` gathers the tensors of `send` (references, no copy) and at
`finish` hands them to vLLM's `NCCLTrainerWeightTransferEngine.send_weights`, which drives the
engine's control plane through a `VLLMWeightSyncClient` (vLLM ships `HTTPVLLMWeightSyncClient` for a
vLLM server's RL routes and `RayVLLMWeightSyncClient` for AsyncLLM actors): `start_weight_update`,
`update_weights` concurrently with the broadcast, `finish_weight_update`. Only then is the version
published; the handle says the weights are already in the engine (`location` "engine"), so the
server's publisher only records the swap (`NcclReceiver.open` raises HandleGone: a restarted server
reads the durable checkpoint). The tensors must not change between `send` and `finish`.

Authentication: no copy of the weights rests anywhere between the sender and the engine (the
collective is the transfer), so there is nothing for a receiver to verify against the row's nonce and
digest; who may join the group is the rendezvous's (`master_address`/`master_port`) to decide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from liveloop.transport.base import HandleGone, Receiver, Sender, TransportUnavailable, WeightHandle
from liveloop.transport.config import TransportConfig
from liveloop.transport.weights import WeightSource


def trainer_init_info(config: TransportConfig) -> Any:
    """vLLM's `NCCLTrainerInitInfo` for the learner (rank 0, the sender)."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    return NCCLTrainerInitInfo(
        master_address=config.master_address,
        master_port=config.master_port,
        world_size=config.world_size,
        packed=config.packed,
        packed_buffer_size_bytes=config.packed_buffer_size_bytes,
        packed_num_buffers=config.packed_num_buffers,
        rank=0,
    )


def worker_init_info(config: TransportConfig) -> Any:
    """vLLM's `NCCLWeightTransferInitInfo` the workers join with (after the sender's rank 0)."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    return NCCLWeightTransferInitInfo(
        master_address=config.master_address,
        master_port=config.master_port,
        rank_offset=1,
        world_size=config.world_size,
        packed=config.packed,
        packed_buffer_size_bytes=config.packed_buffer_size_bytes,
        packed_num_buffers=config.packed_num_buffers,
    )


def update_info(tensors: list[tuple[str, torch.Tensor]]) -> Any:
    """vLLM's `NCCLWeightTransferUpdateInfo` for one round: what the workers allocate to receive."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    return NCCLWeightTransferUpdateInfo(
        names=[n for n, _ in tensors],
        dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in tensors],
        shapes=[list(t.shape) for _, t in tensors],
    )


class _Gathered:
    """The tensors of one update as vLLM's `WeightSource` (metadata, then the same order when iterated)."""

    def __init__(self, pairs: list[tuple[str, torch.Tensor]]):
        from vllm.distributed.weight_transfer.base import ParamMeta

        self.pairs = pairs
        self._meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in pairs]

    def metadata(self) -> list[Any]:
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.pairs)


class NcclSender(Sender):
    backend = "nccl"

    def __init__(self, config: TransportConfig, client: Any):
        """`client`: a vLLM `VLLMWeightSyncClient` reaching the serving engine's control plane."""
        super().__init__()
        self.config = config
        self.client = client
        self._engine: Any = None
        self._pairs: list[tuple[str, torch.Tensor]] = []

    def _init(self) -> None:
        if not torch.cuda.is_available():
            raise TransportUnavailable("nccl: no CUDA device")
        from vllm.distributed.weight_transfer.base import WeightSource as VllmSource
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

        VllmSource.register(_Gathered)  # vLLM's ABC: our source satisfies it structurally
        self._source = _Gathered([])
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(trainer_init_info(self.config), client=self.client, source=self._source)

    def _start(self, version: int) -> None:
        self._pairs = []

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        self._pairs.extend((n, t.detach()) for n, t in tensors.items())

    def _finish(self, version: int) -> WeightHandle:
        self._engine.source = _Gathered(self._pairs)
        self._engine.send_weights()  # start, update (with the broadcast), finish: all or an error
        self._pairs = []
        return WeightHandle(self.backend, version, "engine")

    def _abort(self, version: int) -> None:
        self._pairs = []

    def close(self) -> None:
        super().close()
        if self._engine is not None:
            self._engine.shutdown()


class NcclReceiver(Receiver):
    backend = "nccl"

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        return WeightHandle(self.backend, version, "engine", nonce=nonce, digest=digest)

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        raise HandleGone("nccl: the sender pushed this version into the engine itself; there is nothing to open (read the durable checkpoint)")
        yield  # pragma: no cover


def sender(config: TransportConfig, path_for: Callable[[int], Path] | None = None, base_model: str | Path | None = None,
           client: Any = None) -> NcclSender:
    """The registry's constructor (`liveloop.transport.make_sender`): needs a vLLM `VLLMWeightSyncClient`."""
    if client is None:
        raise ValueError("nccl transport: a vLLM weight-sync client is required")
    return NcclSender(config, client)


def receiver(config: TransportConfig) -> NcclReceiver:
    return NcclReceiver()
