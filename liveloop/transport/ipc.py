"""The `ipc` backend: a learner and an engine on the SAME GPU share the new weights through CUDA IPC
handles, vLLM's `ipc` weight-transfer backend (vllm/distributed/weight_transfer/ipc_engine.py).

What runs and is tested on CPU: the handle and payload encoding (`update_payload` builds exactly the
dict vLLM's `IPCWeightTransferUpdateInfo` accepts), the mailbox that carries it to the server (a shared
memory document named after the version, like the `shared_memory` manifest), and the naming. The CUDA
parts (`reduce_tensor` / `rebuild_cuda_tensor`) are torch's own, exercised by bench/gpu_check.sh.

The sender keeps a contiguous copy of each tensor alive (a consumer's IPC views need the producer's
memory) until the version is `release`d or more than `keep_versions` exist, and `finish` writes the
mailbox. A vLLM engine takes `update_request(handle)` as its `update_info`; the hf engine on the same
GPU takes `open(handle)` (views of the learner's memory). The vLLM call sequence: docs/transport.md, "ipc".

Authenticated: the mailbox lives in the deployment's private directory, and its handle carries the
attempt's nonce and a digest of the exact `update_info` (the pickled IPC handles included), recorded in
the version's row. The receiver checks both BEFORE anything is unpickled or handed to vLLM: pickle is
never loaded from an unchecked file.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from liveloop.transport import shared_memory as shm
from liveloop.transport.base import (
    HandleGone, Receiver, Sender, TransportFailed, TransportUnavailable, WeightHandle, new_nonce, require_authenticated, verify,
)
from liveloop.transport.config import TransportConfig
from liveloop.transport.weights import NamedTensors, WeightSource


def mailbox_name(namespace: str, version: int) -> str:
    return shm.manifest_name(namespace, version)  # the shared_memory manifest's path: one naming scheme


def payload_digest(update_info: dict[str, Any]) -> str:
    """sha256 of an `update_info` in canonical JSON (what the row's `weights_digest` names for ipc)."""
    return hashlib.sha256(json.dumps(update_info, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode_handles(handles: list[dict[str, tuple]]) -> str:
    """vLLM's `ipc_handles_pickled`: base64 of the pickled per-tensor {gpu_uuid: rebuild args}."""
    return base64.b64encode(pickle.dumps(handles)).decode()


def decode_handles(text: str) -> list[dict[str, tuple]]:
    return pickle.loads(base64.b64decode(text))


def update_payload(names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]], handles: list[dict[str, tuple]], pickled: bool) -> dict[str, Any]:
    """One update's `update_info` in vLLM's `IPCWeightTransferUpdateInfo` shape (unpacked mode)."""
    payload: dict[str, Any] = {
        "names": list(names),
        "dtype_names": [str(d).removeprefix("torch.") for d in dtypes],
        "shapes": [list(s) for s in shapes],
    }
    if pickled:
        payload["ipc_handles_pickled"] = encode_handles(handles)
    else:
        payload["ipc_handles"] = handles
    return payload


class IpcSender(Sender):
    backend = "ipc"

    def __init__(self, namespace: str, keep_versions: int = 2):
        super().__init__()
        self.namespace = namespace
        self.keep_versions = keep_versions
        self._alive: dict[int, list[torch.Tensor]] = {}  # version -> the copies consumers view
        self._pending: tuple[list[str], list[torch.dtype], list[list[int]], list[dict[str, tuple]], list[torch.Tensor]] | None = None

    def _init(self) -> None:
        if not torch.cuda.is_available():
            raise TransportUnavailable("ipc: no CUDA device (use shared_memory for a CPU engine)")
        self._uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)

    def _start(self, version: int) -> None:
        shm.remove_version(self.namespace, version)
        self._pending = ([], [], [], [], [])

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        from torch.multiprocessing.reductions import reduce_tensor

        names, dtypes, shapes, handles, refs = self._pending  # type: ignore[misc]
        for name, t in tensors.items():
            if not t.is_cuda:
                raise TransportFailed(f"ipc: {name} is on {t.device}; CUDA IPC shares GPU memory only")
            weight = t.detach().clone().contiguous()  # the learner keeps training its own
            refs.append(weight)
            _, args = reduce_tensor(weight)
            names.append(name)
            dtypes.append(weight.dtype)
            shapes.append(list(weight.shape))
            handles.append({self._uuid: args})

    def _finish(self, version: int) -> WeightHandle:
        names, dtypes, shapes, handles, refs = self._pending  # type: ignore[misc]
        torch.cuda.synchronize()  # the copies are complete before anyone reads them
        name = mailbox_name(self.namespace, version)
        info, nonce = update_payload(names, dtypes, shapes, handles, pickled=True), new_nonce()
        digest = payload_digest(info)
        shm.write_doc(name, {"version": version, "nonce": nonce, "update_info": info})
        self._alive[version] = refs
        self._pending = None
        for old in sorted(self._alive)[: max(0, len(self._alive) - self.keep_versions)]:
            self.release(old)
        return WeightHandle(self.backend, version, name, {"tensors": len(names)}, nonce=nonce, digest=digest)

    def _abort(self, version: int) -> None:
        self._pending = None
        shm.unlink(mailbox_name(self.namespace, version))

    def release(self, version: int) -> None:
        shm.unlink(mailbox_name(self.namespace, version))
        if self._alive.pop(version, None) is not None:
            torch.cuda.ipc_collect()


class IpcReceiver(Receiver):
    backend = "ipc"

    def __init__(self, namespace: str):
        self.namespace = namespace

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        return WeightHandle(self.backend, version, mailbox_name(self.namespace, version), nonce=nonce, digest=digest)

    def update_request(self, handle: WeightHandle) -> dict[str, Any]:
        """The `update_info` for vLLM's `update_weights` (see the module docstring), verified against the
        handle's nonce and digest before it is returned (WeightsUnverified otherwise)."""
        require_authenticated(handle, "ipc")
        doc = shm.read_doc(handle.location)
        if doc.get("version") != handle.version:
            raise HandleGone(f"ipc: {handle.location} holds version {doc.get('version')}, not {handle.version}")
        info = doc.get("update_info")
        verify(handle, doc.get("nonce"), payload_digest(info) if isinstance(info, dict) else None, handle.location)
        return info

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        info = self.update_request(handle)
        if not torch.cuda.is_available():
            raise TransportUnavailable("ipc: no CUDA device here")
        device = torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        tensors = {}
        for name, by_gpu in zip(info["names"], decode_handles(info["ipc_handles_pickled"])):
            if uuid not in by_gpu:
                raise HandleGone(f"ipc: {name} lives on another GPU ({list(by_gpu)}), not {uuid}")
            args = list(by_gpu[uuid])
            args[6] = device  # the device index as this process numbers it
            tensors[name] = rebuild_cuda_tensor(*args)
        yield NamedTensors(tensors)

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        with self.open(handle) as source:
            assert isinstance(source, NamedTensors)
            return {k: v.clone() for k, v in source.tensors.items()}


def sender(config: TransportConfig, path_for: Callable[[int], Path] | None = None, base_model: str | Path | None = None,
           client: Any = None) -> IpcSender:
    """The registry's constructor (`liveloop.transport.make_sender`)."""
    return IpcSender(config.namespace, config.keep_versions)


def receiver(config: TransportConfig) -> IpcReceiver:
    return IpcReceiver(config.namespace)
