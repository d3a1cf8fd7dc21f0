"""The nccl backend's rendezvous listens where `[transport] master_address` says, and nowhere else.

The learner is rank 0 of vLLM's weight-transfer group: vLLM's `trainer_init` opens the group through
`stateless_init_process_group(master_address, master_port, ...)`, whose rank 0 binds the TCPStore's
listening socket to (master_address, master_port) itself (vllm/distributed/utils.py
`StatelessProcessGroup.create`) and hands torch the bound descriptor. NCCL itself needs a GPU, so the
communicator built over the group is replaced here by a recorder; the rendezvous (vLLM's own code, a
real TCPStore, a worker joining as rank 1 over the worker's init info) is real.
"""

from __future__ import annotations

import socket
import threading

import psutil
import pytest

from liveloop.devtools import free_port
from liveloop.transport.config import TransportConfig
from liveloop.transport.nccl import trainer_init_info, worker_init_info

pytest.importorskip("vllm.distributed.weight_transfer.nccl_common")


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (where a wildcard listener would also answer)."""
    return [
        a.address for addrs in psutil.net_if_addrs().values() for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


def test_the_rendezvous_listens_on_master_address_only(monkeypatch):
    from vllm.distributed.device_communicators import pynccl
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.weight_transfer import nccl_common

    class Recorder:  # NCCL needs a GPU: the group it would be built over is what is kept
        def __init__(self, group, device=None):
            self.group = group

    monkeypatch.setattr(pynccl, "PyNcclCommunicator", Recorder)
    config = TransportConfig(backend="nccl", master_port=free_port())
    trainer, worker = trainer_init_info(config), worker_init_info(config)
    assert trainer.master_address == worker.master_address == "127.0.0.1"

    joined: dict[str, object] = {}

    def join_as_worker() -> None:
        joined["group"] = StatelessProcessGroup.create(
            host=worker.master_address, port=worker.master_port, rank=worker.rank_offset, world_size=worker.world_size,
        )

    t = threading.Thread(target=join_as_worker, daemon=True)
    t.start()
    comm = nccl_common.stateless_init_process_group(
        trainer.master_address, trainer.master_port, 0, trainer.world_size, device=None,
    )
    t.join(timeout=60)
    assert "group" in joined, "the worker did not join the rendezvous"
    assert comm.group.world_size == 2 and comm.group.rank == 0

    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == config.master_port]
    assert listening, "no socket listens on the rendezvous port"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening
    for address in _other_addresses():
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect((address, config.master_port))


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "", "*"])
def test_a_wildcard_rendezvous_address_is_refused(wildcard):
    with pytest.raises(ValueError, match="master_address"):
        TransportConfig(backend="nccl", master_address=wildcard)
