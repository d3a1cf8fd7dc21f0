"""The `[transport]` config, the handle's encoding, and the CPU-testable parts of the GPU backends (the
ipc and nccl payloads, checked against vLLM's own typed infos; the CUDA data paths need a GPU)."""

from __future__ import annotations

import pytest
import torch

from liveloop.config import load_section
from liveloop.transport import HandleGone, TransportConfig, TransportUnavailable, WeightHandle, WeightsUnverified, make_receiver, make_sender
from liveloop.transport import ipc, nccl
from liveloop.transport import shared_memory as shm


def test_config_defaults_to_todays_checkpoint_dir():
    c = TransportConfig()
    assert c.backend == "checkpoint_dir" and not c.in_memory
    assert TransportConfig(backend="shared_memory").in_memory


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"backend": "rdma"}, "backend"),
        ({"namespace": "has space"}, "namespace"),
        ({"namespace": "x" * 17}, "namespace"),
        ({"keep_versions": 0}, "keep_versions"),
        ({"durable_wait_seconds": -1}, "durable_wait_seconds"),
        ({"master_port": 0}, "master_port"),
        ({"world_size": 1}, "world_size"),
        ({"packed_buffer_size_bytes": 1024}, "packed_buffer_size_bytes"),
    ],
)
def test_config_refuses_bad_values(kw, key):
    with pytest.raises(ValueError, match=key):
        TransportConfig(**kw)


def test_config_loads_from_a_toml_table():
    c = load_section(TransportConfig, {"backend": "shared_memory", "keep_versions": 3}, "transport")
    assert (c.backend, c.keep_versions) == ("shared_memory", 3)


def test_handle_round_trips_through_json():
    h = WeightHandle("shared_memory", 12, "ll_x_v00000012_m", {"segments": 2})
    assert WeightHandle.from_json(h.to_json()) == h


def test_ipc_payload_is_what_vllm_accepts():
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo, IPCWeightTransferUpdateInfo

    handles = [{"GPU-uuid": (1, (2, 3), "args")}, {"GPU-uuid": (4,)}]
    payload = ipc.update_payload(["a", "b"], [torch.bfloat16, torch.float32], [[2, 3], [4]], handles, pickled=False)
    info = IPCWeightTransferUpdateInfo(**payload)
    assert info.dtype_names == ["bfloat16", "float32"] and info.ipc_handles == handles
    pickled = ipc.update_payload(["a", "b"], [torch.bfloat16, torch.float32], [[2, 3], [4]], handles, pickled=True)
    assert ipc.decode_handles(pickled["ipc_handles_pickled"]) == handles
    assert IPCWeightTransferInitInfo(packed=False).packed is False
    with pytest.raises(ValueError):  # vLLM's own check: one handle per name
        IPCWeightTransferUpdateInfo(**ipc.update_payload(["a"], [torch.float32], [[1]], handles, pickled=False))


def test_ipc_mailbox_carries_the_payload_by_version_and_is_verified_before_anything_is_unpickled(namespace):
    receiver = make_receiver(TransportConfig(backend="ipc", namespace=namespace))
    payload = ipc.update_payload(["w"], [torch.float16], [[8]], [{"GPU-0": ("x",)}], pickled=True)
    # what the sender's handle names and the learner records in the row
    handle = receiver.handle_for(5, nonce="ab" * 16, digest=ipc.payload_digest(payload))
    shm.write_doc(handle.location, {"version": 5, "nonce": "ab" * 16, "update_info": payload})
    assert receiver.update_request(handle) == payload
    # a mailbox someone else wrote under the same name: refused before its pickle is touched
    shm.unlink(handle.location)
    evil = ipc.update_payload(["w"], [torch.float16], [[8]], [{"GPU-0": ("y",)}], pickled=True)
    shm.write_doc(handle.location, {"version": 5, "nonce": "ab" * 16, "update_info": evil})
    with pytest.raises(WeightsUnverified, match="digest"):
        receiver.update_request(handle)
    with pytest.raises(HandleGone, match="no nonce and digest"):
        receiver.update_request(receiver.handle_for(5))  # a row that names nothing opens nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_ipc_sender_refuses_without_cuda():
    sender = make_sender(TransportConfig(backend="ipc", namespace="tnocuda"))
    with pytest.raises(TransportUnavailable):
        sender.init()


def test_nccl_infos_are_what_vllm_accepts():
    c = TransportConfig(backend="nccl", master_address="10.0.0.2", master_port=31000, world_size=3, packed=True)
    trainer = nccl.trainer_init_info(c)
    assert trainer.is_sender and trainer.backend == "nccl" and trainer.world_size == 3
    worker = nccl.worker_init_info(c)
    assert (worker.rank_offset, worker.master_address, worker.master_port, worker.packed) == (1, "10.0.0.2", 31000, True)
    info = nccl.update_info([("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(()))])
    assert info.names == ["a", "b"] and info.dtype_names == ["bfloat16", "float32"] and info.shapes == [[2, 3], []]


def test_nccl_sender_needs_a_client():
    with pytest.raises(ValueError, match="client"):
        make_sender(TransportConfig(backend="nccl"))
