"""A SIGTERM to the server's whole process group and to every process of its tree (`kill -TERM -PGID`,
systemd's control-group kill) stops a real `liveloop serve` with its co-located learner
(a private Ray: GCS, raylet, agents, the learner's worker) cleanly: exit 0, no traceback, the leader
lease released and the replica's registry row removed, every child gone. A second SIGTERM sent while it
stops is logged and ignored instead of cutting the shutdown short."""

from __future__ import annotations

import os
import signal
import socket
import time

import psutil
import pytest

from liveloop.store.lease import LEADER

from .conftest import open_store, start_server

pytestmark = pytest.mark.slow


def test_a_process_group_sigterm_stops_the_server_cleanly(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf", learner="")
    store = open_store(server)
    try:
        pgid = os.getpgid(server.proc.pid)
        assert pgid == server.proc.pid  # its own group, as a service manager starts it
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert {"gcs_server", "raylet"} <= {c.name() for c in children}  # Ray's daemons: what the group signal reached
        (row,) = [r for r in store.fleet.registry.rows(60.0) if (r.host, r.pid) == (socket.gethostname(), server.proc.pid)]
        assert store.fleet.leases.get(LEADER).holder.startswith(row.replica_id)
        os.killpg(pgid, signal.SIGTERM)
        for child in children:  # and to every process of the tree, as systemd's KillMode=control-group does
            os.kill(child.pid, signal.SIGTERM)
        time.sleep(0.5)
        try:
            os.killpg(pgid, signal.SIGTERM)  # a second one, while it stops
        except ProcessLookupError:
            pass
        assert server.proc.wait(120) == 0, server.log_tail()
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log and "SIGTERM: stopping" in log
        assert store.fleet.leases.get(LEADER).holder is None  # released: the next server leads at once
        assert store.fleet.registry.rows(3600.0) == []
        time.sleep(1)
        assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        server.stop()
        store.close()


def test_a_sigterm_to_the_server_alone_stops_its_engine_and_learner(tmp_path, model_dir):
    """`kill PID` (a service manager's stop, a user's `kill`): only the server's process gets the signal. Ray's
    driver installs a failure-signal handler that re-raises SIGTERM after logging it; the server must still
    stop in order, so vLLM's engine core and the learner's Ray are not left running without it."""
    server = start_server(tmp_path / "srv", model_dir, "vllm", learner="")
    try:
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(c.cmdline()) or c.name().startswith("VLLM") for c in children), [c.name() for c in children]
        os.kill(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(120) == 0, server.log_tail()
        assert "SIGTERM: stopping" in server.log_path.read_text(errors="replace")
        deadline = time.monotonic() + 30  # bounded: the children's own exits after their parent's stop
        while time.monotonic() < deadline and any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
            time.sleep(0.5)
        left = [f"{c.pid} {c.name()}" for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"left running after the server stopped: {left}"
    finally:
        server.stop()
