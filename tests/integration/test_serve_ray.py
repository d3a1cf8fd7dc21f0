"""A Ray Serve replica (liveloop/serve_ray.py `LiveloopReplica`) tells Serve when its engine stopped
serving. The deployment's class runs here as Serve runs a replica, in this process (Serve's own
replica wrapper, as its local testing mode uses it; none of Ray is started): the replica context set,
its constructor, `__serve_build_asgi_app__` and the app's lifespan (the hf engine on the tiny model,
SQLite migrated by the driver's `prepare_store`, no learner), then Serve's health check, which calls the
replica's `check_health`. It passes while the engine serves, fails once the engine's process is killed
(`kill -9`: how an engine dies), and passes again once the app has stopped (nothing to check then)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray import serve
from ray.serve import context as serve_context
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve._private.replica import UserCallableWrapper

from liveloop.config import load_config
from liveloop.devtools import free_port, wait_until, write_config
from liveloop.serve_ray import APP_NAME, _replica_class, deployment_options, prepare_store, replica_config

START_S = 300  # a hang guard for the replica's start (the engine's process loads the model)


@pytest.fixture
def replica(tmp_path, model_dir, monkeypatch) -> Iterator[UserCallableWrapper]:
    """One replica started as Serve starts it, in this process; stopped (its app's lifespan ended) after."""
    model = Path(model_dir).resolve()
    path, _ = write_config(tmp_path, model, "hf", free_port(), extra="[monitor]\nenabled = false\n[ray]\nenabled = true\nreplicas = 1\n")
    config = load_config(path)
    prepare_store(config, model)  # what the driver does before any replica starts
    deployment = serve.deployment(_replica_class()).options(**deployment_options(config))
    deployment_id = DeploymentID(deployment.name, APP_NAME)
    monkeypatch.setattr(serve_context, "_INTERNAL_REPLICA_CONTEXT", serve_context.ReplicaContext(
        replica_id=ReplicaID("health-check", deployment_id), servable_object=None,
        _deployment_config=deployment._deployment_config, rank=None, world_size=1,
    ))  # what a replica actor sets before it constructs the class (the constructor reads its replica id)
    wrapper = UserCallableWrapper(
        deployment.func_or_class, (replica_config(config), str(model), None), {}, deployment_id=deployment_id,
        run_sync_methods_in_threadpool=False, run_user_code_in_separate_thread=True, local_testing_mode=True,
        deployment_config=deployment._deployment_config, actor_id="health-check",
    )
    wrapper.initialize_callable().result(START_S)  # constructor, `__serve_build_asgi_app__`, the lifespan's start
    try:
        yield wrapper
    finally:
        wrapper.call_destructor().result(120)  # the lifespan's end (idempotent)


def test_the_health_check_fails_once_the_engine_died(replica):
    replica.call_user_health_check().result(30)  # serving: passes
    engine = replica.user_callable.fastapi.state.server.engine
    assert engine.healthy()
    os.kill(engine._process.pid, signal.SIGKILL)
    wait_until(lambda: not engine.healthy(), 30, "the engine to see its process gone")
    with pytest.raises(RuntimeError, match="the engine stopped serving"):
        replica.call_user_health_check().result(30)
    replica.call_destructor().result(120)  # the app stops: no engine to check
    assert replica.user_callable.fastapi.state.server is None
    replica.call_user_health_check().result(30)
