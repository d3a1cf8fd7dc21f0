"""`liveloop serve` with `[ray] enabled` (`--config ray`): the endpoint as a Ray Serve application of
`[ray] replicas` replicas and ONE learner actor for all of them, every part talking only through the
store (PostgreSQL: several processes write at once).

    driver (`liveloop serve`)        the private local Ray (loopback, token auth: learner/actor.py's
      |                              `start_private_ray`), or the cluster at `[ray] address`
      |-- Serve HTTP proxy           `[ray] http_host:http_port` ([server] host/port by default)
      |-- LiveloopReplica x N        each: the SAME FastAPI app and server components as a plain
      |                              `liveloop serve` (liveloop/app.py `build_app`): its own engine,
      |                              writer, version watcher and heartbeat; `[ray] replica_cpus` each
      |-- LearnerHost (named actor)  the supervisor `ColocatedLearner` and its learner actor (1 CPU)

- The driver migrates the store, makes version 0 and sweeps the deployment's shared memory once,
  before any replica starts; replicas never migrate (`auto_migrate` off in theirs) nor sweep (one
  restarted while the learner writes a version would remove it as unfinished).
- Each replica is `@serve.ingress` late-bound: `__serve_build_asgi_app__` builds the app with the
  replica's Serve id as its registry id, and Serve runs its lifespan (a replica killed with `kill -9`
  is restarted by Serve and catches up from the store at start).
- Versions: the learner publishes a version once; every replica's watcher activates or follows it
  (server/control/watcher.py), so a rollback, an import or a pause through any replica reaches all.
- The learner's health and status reach every replica through `RemoteLearner`, a view of the named
  `LearnerHost` actor polled off the event loop (`health()` never blocks a request).
- One replica leads (server/control/leader.py); every replica routes canaries alike (`_replica_class`).
- Serve's HTTP proxy answers instead of uvicorn, its queue bounded (`deployment_options`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveloop.config import Config

if TYPE_CHECKING:
    from fastapi import FastAPI

    from liveloop.app import Server
    from liveloop.learner.status import LearnerStatus

log = logging.getLogger(__name__)

APP_NAME = "liveloop"
LEARNER_NAMESPACE = "liveloop"


def learner_name(deployment_id: str) -> str:
    """The named learner actor of one deployment (several deployments may share a cluster)."""
    return f"liveloop-learner-{deployment_id[:16]}"


# -- the learner, shared by the replicas --------------------------------------------------------------
class LearnerHost:
    """The co-located learner's supervisor (learner/actor.py `ColocatedLearner`) inside a named Ray
    actor, so every replica can ask it for health and status. The supervisor finds Ray running and
    places its learner actor (1 CPU) in the same cluster."""

    def __init__(self, config: Config, model_dir: str):
        from liveloop.app import start_learner

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s learner-host: %(message)s")
        self.learner = start_learner(config, Path(model_dir))

    def health(self) -> Any:
        return self.learner.health()

    def status(self, timeout: float = 10) -> LearnerStatus:
        """The learner's typed status, as the supervisor returns it."""
        return self.learner.status(timeout)

    def close(self) -> None:
        self.learner.close()


class RemoteLearner:
    """A replica's view of the fleet's learner (the edge's `LearnerView`, read by its ops and admin
    handlers): `health()` answers from the last poll of the named `LearnerHost` (every `poll_s`, on a
    thread; "starting" until it is found, "unreachable" when it does not answer), `status()` asks it;
    `close()` stops looking."""

    def __init__(self, name: str, poll_s: float = 0.5):
        from liveloop.learner.actor import LearnerHealth

        self.name, self.poll_s = name, poll_s
        self._health = LearnerHealth("starting", 0, None)
        self._handle: Any = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="learner-view", daemon=True)
        self._thread.start()

    def _find(self) -> Any:
        import ray

        if self._handle is None:
            self._handle = ray.get_actor(self.name, namespace=LEARNER_NAMESPACE)
        return self._handle

    def _poll(self) -> None:
        import ray

        from liveloop.learner.actor import LearnerHealth

        while not self._closing.is_set():
            try:
                self._health = ray.get(self._find().health.remote(), timeout=5)
            except ValueError:  # not created yet (the driver starts it after the replicas)
                pass
            except ray.exceptions.GetTimeoutError:  # still loading its models, or busy
                if self._health.state != "starting":
                    self._health = LearnerHealth("unreachable", self._health.restarts, "the learner did not answer within 5 s")
            except Exception as exc:
                self._handle = None
                self._health = LearnerHealth("unreachable", self._health.restarts, f"{type(exc).__name__}: {exc}"[:500])
            self._closing.wait(self.poll_s)

    def health(self) -> Any:
        return self._health

    def status(self, timeout: float = 10) -> LearnerStatus:
        """The learner's typed status, asked of the `LearnerHost`."""
        import ray

        from liveloop.learner.actor import LearnerUnavailable

        try:
            return ray.get(self._find().status.remote(timeout), timeout=timeout + 2)
        except Exception as exc:
            raise LearnerUnavailable(f"the learner did not answer: {type(exc).__name__}: {exc}"[:500]) from exc

    def close(self) -> None:
        self._closing.set()


# -- a replica ----------------------------------------------------------------------------------------
def _replica_class() -> Any:
    """The Serve deployment class (built on first use: importing Serve costs a second).

    One replica leads (server/control/leader.py: the store's "leader" lease, `[server]
    leader_lease_seconds`): its release gate alone starts candidates, evaluates and promotes or holds them, and its operations alone
    record alarms (drift and reward hacking), roll back (guard), quarantine and apply retention. Every
    replica routes: under `[release] mode` canary or gated each builds its own `CanaryEngine`, and its
    gate's pass loads the store's CANARY version into that replica's candidate engine (and drops one the
    store no longer names), so every replica sends the same canary users to the same candidate; a
    promotion reaches the others through the activator's follower rule (the candidate they hold becomes
    their live engine, no load). A leader killed with `kill -9` (Serve restarts it as a new holder) is
    replaced by another replica within the lease and a third; one stopped cleanly releases the lease."""
    from ray import serve

    @serve.ingress()
    class LiveloopReplica:
        """One replica: the FastAPI app of a plain `liveloop serve` with its own components."""

        def __init__(self, config: Config, model_dir: str, learner: str | None):
            import torch

            torch.set_num_threads(1)
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s replica: %(message)s")
            replica = serve.get_replica_context().replica_id.unique_id
            self.config = config.with_section("server", replica_id=f"serve-{replica}")
            self.model_dir = Path(model_dir)
            self.learner = learner
            self.fastapi: FastAPI | None = None  # `__serve_build_asgi_app__`'s

        def __serve_build_asgi_app__(self) -> FastAPI:
            from liveloop.app import build_app

            def view(config: Config, model_dir: Path) -> RemoteLearner | None:
                return None if self.learner is None else RemoteLearner(self.learner)

            self.fastapi = build_app(self.config, self.model_dir, view)  # state.server: its Server while it runs
            return self.fastapi

        def check_health(self) -> None:
            """Tells Serve an engine that stopped serving (nothing before the app has started or after it stopped)."""
            server: Server | None = None if self.fastapi is None else self.fastapi.state.server
            if server is not None and not server.engine.healthy():
                raise RuntimeError("the engine stopped serving")

    return LiveloopReplica


# -- the driver ---------------------------------------------------------------------------------------
def http_bind(config: Config) -> tuple[str, int]:
    """Where Serve's HTTP proxy listens: `[ray] http_host:http_port`, by default `[server] host:port`."""
    return config.ray.http_host or config.server.host, config.ray.http_port or config.server.port


def replica_config(config: Config) -> Config:
    """What each replica runs: the Serve bind as its [server] host/port (the Host allow-list and the
    bind check follow it), the store migrated already."""
    host, port = http_bind(config)
    config = dataclasses.replace(config, server=dataclasses.replace(config.server, host=host, port=port))
    return config.with_section("store", auto_migrate=False)


def prepare_store(config: Config, model_dir: Path) -> str:
    """Migrate (or check) the store, make version 0 and sweep what the deployment left in shared memory
    (server/control/startup.py), once, before any replica starts (a replica restarted later must not sweep: the
    learner may be writing a version then); returns the deployment's id."""
    from liveloop.metrics import Metrics
    from liveloop.server.control.startup import sweep_shared_memory
    from liveloop.store import Store

    store = Store(config.store)
    try:
        if config.store.auto_migrate:
            store.migrate()
        store.require_schema()
        if store.versions.latest_version() is None:
            store.versions.ensure_base_version(str(model_dir.resolve()))
        sweep_shared_memory(store.versions, store.operator, config.transport_for_store(), Metrics())
        return store.fleet.deployment_id()
    finally:
        store.close()


def deployment_options(config: Config) -> dict[str, Any]:
    """The replicas' Serve deployment options: their number and CPUs, and the proxy's bounds (what one
    replica is sent at once, how many requests wait for one: never an unbounded queue; beyond, a 503
    with Retry-After).

    Serve's own HTTP proxy answers instead of uvicorn in the driver, so `[server] header_timeout_seconds`
    (a uvicorn protocol of ours) does not apply there; every route, the Host allow-list, body limits and
    admission do, in each replica. The proxy's queue is bounded: it sends a replica
    at most `[ray] max_ongoing_requests` at once and holds at most `[ray] max_queued_requests` waiting for
    one (both 0: `[server] max_concurrent_total`); past that it answers 503 at once, with `Retry-After:
    [server] retry_after_seconds`, and the request reaches no replica."""
    from ray.serve.config import BackpressureConfig

    return {
        "num_replicas": config.ray.replicas,
        "ray_actor_options": {"num_cpus": config.ray.replica_cpus},
        "max_ongoing_requests": config.ray.max_ongoing_requests or config.server.max_concurrent_total,
        "max_queued_requests": config.ray.max_queued_requests or config.server.max_concurrent_total,
        "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=config.server.retry_after_seconds),
        "health_check_period_s": 2.0,
        "graceful_shutdown_timeout_s": 30.0,
    }


class Fleet:
    """The running application: Ray (private or joined), Serve with N replicas, the learner host."""

    def __init__(self, config: Config, model_dir: Path):
        import ray
        from ray import serve

        from liveloop.learner.actor import start_private_ray
        from liveloop.server.edge.app import check_bind

        self.config = replica_config(config)
        check_bind(self.config)
        deployment = prepare_store(config, model_dir)
        self._ray_dir: Path | None = None
        if config.ray.address:
            ray.init(address=config.ray.address, configure_logging=False, log_to_driver=True)
        else:
            self._ray_dir = start_private_ray(config.ray.num_cpus)
        self._learner: Any = None
        try:
            host, port = http_bind(config)
            serve.start(http_options={"host": host, "port": port, "keep_alive_timeout_s": math.ceil(config.server.keep_alive_seconds)})
            name = learner_name(deployment) if config.learner.enabled else None
            replica = serve.deployment(_replica_class()).options(**deployment_options(config))
            started = time.monotonic()
            serve.run(replica.bind(self.config, str(model_dir.resolve()), name), name=APP_NAME, route_prefix="/")
            log.info("%d replicas serving on http://%s:%d (%.0f s)", config.ray.replicas, host, port, time.monotonic() - started)
            if name is not None:  # the server first, then the learner (as a plain `liveloop serve`)
                host_cls = ray.remote(num_cpus=0, max_concurrency=8)(LearnerHost)
                self._learner = host_cls.options(name=name, namespace=LEARNER_NAMESPACE).remote(self.config, str(model_dir.resolve()))
                ray.get(self._learner.health.remote())  # its models loaded
                log.info("learner running (%s)", name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """The learner first (it publishes what it has), then the replicas (each flushes its writer and
        leaves the registry), then Ray."""
        import ray
        from ray import serve

        if self._learner is not None:
            try:
                ray.get(self._learner.close.remote(), timeout=150)
            except Exception:
                log.exception("the learner did not stop cleanly")
            self._learner = None
        try:
            serve.shutdown()
        except Exception:
            log.exception("serve shutdown")
        ray.shutdown()
        if self._ray_dir is not None:
            shutil.rmtree(self._ray_dir, ignore_errors=True)
            self._ray_dir = None


def serve_fleet(config: Config, model_dir: Path) -> int:
    """`liveloop serve` with `[ray] enabled`: run the fleet until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    fleet = Fleet(config, model_dir)
    print(f"[liveloop] serving on http://{':'.join(map(str, http_bind(config)))} with {config.ray.replicas} replicas", flush=True)
    try:
        stop.wait()
    finally:
        fleet.close()
    return 0
