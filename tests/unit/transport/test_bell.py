"""The shared_memory transport's bell (liveloop/transport/bell.py): a finished version rings every server
bell in the deployment's directory, a waiting watcher hears the version number at once, a bell whose
server is gone (its socket left behind) is removed by the next ring, and a namespace scan counts bells
neither as versions nor as foreign files."""

from __future__ import annotations

import asyncio
import socket

import torch

from liveloop.transport import TransportConfig, make_receiver, make_sender
from liveloop.transport import shared_memory as shm
from liveloop.transport.bell import Bell, ring


def _publish(sender, version: int) -> None:
    sender.start_update(version)
    sender.send({"w": torch.ones(3)})
    sender.finish()


async def test_a_finished_version_rings_every_server_bell(namespace):
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    sender = make_sender(config)
    sender.init()
    a, b = make_receiver(config).bell(), make_receiver(config).bell()  # two servers on this machine
    try:
        assert await a.wait(0) == []
        waiting = asyncio.create_task(a.wait(3600))  # woken by the ring, not the timeout
        await asyncio.sleep(0)
        _publish(sender, 7)
        assert await asyncio.wait_for(waiting, 60) == [7]
        assert b.rung() == [7]
        _publish(sender, 8)
        _publish(sender, 9)
        assert await a.wait(0) == [8, 9]
        found = shm.scan(namespace)
        assert sorted(found.versions) == [8, 9] and found.foreign == []  # keep_versions 2; bells are neither
    finally:
        a.close()
        b.close()
    assert not any(p.name.startswith("bell-") for p in shm.directory(namespace).iterdir())


def test_a_bell_whose_server_is_gone_is_removed_by_the_next_ring(namespace):
    folder = shm.directory(namespace)
    live = Bell(folder)
    dead = Bell(folder)
    dead._sock.close()  # killed: its socket file stays, nobody listens
    try:
        assert dead.path.exists()
        assert ring(folder, 3) == 1
        assert not dead.path.exists() and live.rung() == [3]
    finally:
        live.close()


def test_no_bell_when_the_deployment_turns_it_off(namespace):
    config = TransportConfig(backend="shared_memory", namespace=namespace, bell=False)
    assert make_receiver(config).bell() is None
    listening = Bell(shm.directory(namespace))  # a server with its bell on, beside a sender with it off
    try:
        sender = make_sender(config)
        sender.init()
        _publish(sender, 1)
        assert listening.rung() == []
    finally:
        listening.close()
    assert make_receiver(TransportConfig(backend="checkpoint_dir")).bell() is None  # rings nothing: the watcher polls


def test_a_ring_reaches_only_sockets_named_as_bells(namespace):
    folder = shm.directory(namespace)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(str(folder / "not-a-bell.sock"))
    try:
        assert ring(folder, 1) == 0
        other.setblocking(False)
        try:
            other.recv(64)
            raise AssertionError("a socket not named as a bell was rung")
        except BlockingIOError:
            pass
    finally:
        other.close()
        (folder / "not-a-bell.sock").unlink()
