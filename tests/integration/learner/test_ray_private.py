"""The co-located learner's Ray is private: every listening socket of its processes is on loopback,
its session files sit in a directory only this user can enter, and its GCS and raylet refuse a client
without the cluster's token (which is on no command line)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import grpc
import psutil
import pytest

from liveloop.critic.config import CriticConfig
from liveloop.learner.actor import ColocatedLearner, is_loopback, private_ray_env
from liveloop.learner.config import LearnerConfig
from liveloop.segments import SegmentsConfig
from liveloop.store import Store, StoreConfig

AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture
def default_env(monkeypatch):
    """Ray's settings as an operator who set nothing has them; restored afterwards."""
    for name in AUTH_ENV:
        monkeypatch.setenv(name, "")  # records the original value for teardown
        monkeypatch.delenv(name)


def _rpc(address: str, method: str, metadata) -> grpc.StatusCode:
    """One raw unary call with an empty request; the status code it got."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(b"", metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_private_ray_env_defaults_to_token_and_respects_the_operator():
    env: dict[str, str] = {}
    private_ray_env(env)
    assert env["RAY_AUTH_MODE"] == "token" and len(bytes.fromhex(env["RAY_AUTH_TOKEN"])) == 32
    other: dict[str, str] = {}
    private_ray_env(other)
    assert other["RAY_AUTH_TOKEN"] != env["RAY_AUTH_TOKEN"]  # fresh per process, not a shared default
    operator = {"RAY_AUTH_MODE": "disabled"}
    private_ray_env(operator)
    assert operator == {"RAY_AUTH_MODE": "disabled"}
    with_path = {"RAY_AUTH_TOKEN_PATH": "/etc/ray/token"}
    private_ray_env(with_path)
    assert with_path == {"RAY_AUTH_TOKEN_PATH": "/etc/ray/token", "RAY_AUTH_MODE": "token"}
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"))


def test_colocated_ray_listens_on_loopback_only_and_requires_the_token(tmp_path, model_dir, default_env):
    import ray
    import ray._private.ray_constants as ray_constants

    store_config = StoreConfig(url=f"sqlite:///{tmp_path / 'l.db'}")
    store = Store(store_config)
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    store.close()
    config = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), poll_seconds=0.05)
    learner = ColocatedLearner(store_config, config, SegmentsConfig(), CriticConfig(), model_dir)
    try:
        me = psutil.Process()
        actor_pid = ray.get(learner.actor.pid.remote(), timeout=30)
        # live processes only: a zombie an earlier test left (an engine process not reaped yet) has no cmdline
        pids = {me.pid} | {p.pid for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
        assert actor_pid in pids
        listening = []
        for _ in range(3):  # a few samples: agents may open their ports a little after the actor is up
            listening += [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
            time.sleep(0.5)
        names = {psutil.Process(c.pid).name() for c in listening}
        assert {"gcs_server", "raylet"} <= names and actor_pid in {c.pid for c in listening}
        exposed = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in listening if not is_loopback(c.laddr.ip)]
        assert exposed == [], f"Ray listens beyond loopback: {exposed}"

        node = ray._private.worker._global_node
        session_root = Path(node.address_info["session_dir"]).parents[1]  # Ray's temp dir is 0777, this one's not
        assert stat.S_IMODE(session_root.stat().st_mode) & 0o077 == 0  # other users cannot reach sockets or logs

        token = os.environ["RAY_AUTH_TOKEN"]
        assert os.environ["RAY_AUTH_MODE"] == "token"
        for pid in pids:
            assert token not in " ".join(psutil.Process(pid).cmdline())
        gcs = node.address_info["gcs_address"]
        (info,) = ray.nodes()
        raylet = f"{info['NodeManagerAddress']}:{info['NodeManagerPort']}"
        nodes = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"
        stats = "/ray.rpc.NodeManagerService/GetNodeStats"
        wrong = [("authorization", "Bearer " + "0" * 64)]
        right = [("authorization", "Bearer " + token)]
        assert _rpc(gcs, nodes, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _rpc(gcs, nodes, wrong) == grpc.StatusCode.UNAUTHENTICATED
        assert _rpc(gcs, nodes, right) == grpc.StatusCode.OK  # refused for the token, not for the call
        assert _rpc(raylet, stats, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _rpc(raylet, stats, right) == grpc.StatusCode.OK
    finally:
        learner.close()
    assert learner.health().state == "stopped"
    assert not session_root.exists()
    assert ray_constants.ENABLE_RAY_CLUSTER  # the loopback switch is only flipped while Ray starts
