"""The learner as a Ray actor, co-located with the server on one machine, and its supervisor.

`liveloop serve` starts a local Ray (2 CPUs), places this actor on 1 of them and keeps the HTTP server
and the engine outside Ray (plain uvicorn in the driver: on one 2-core machine Ray Serve would add an
HTTP proxy and a replica process, ~1.5 GB and a hop per request, for nothing). Weights travel as
checkpoint directories: the learner publishes a version row, the server's watcher swaps it in.

The local Ray is private: every listener (GCS, raylet, object manager, workers, agents) binds loopback,
the dashboard is off, its session files live in a 0700 directory, and Ray's token authentication is on
with a fresh 256-bit token per server process, kept in the environment of Ray's processes (never on
disk nor on a command line). Operators can still set RAY_AUTH_MODE / RAY_AUTH_TOKEN(_PATH) themselves.

`ColocatedLearner` supervises the actor: when its worker dies or `run()` raises, it records a
`learner_crash` operator event, backs off, and starts a fresh actor, which resumes from the last
published version and cursor (`OnlineLearner.resume`), then records `learner_restart`. Too many
crashes within a window and it gives up (`learner_failed`). `health()` answers from the supervisor's
own state and never calls into the actor.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.status import LearnerStatus
from liveloop.segments import SegmentsConfig
from liveloop.temp_dirs import owned_temp_dir
from liveloop.store import StoreConfig
from liveloop.transport import TransportConfig

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_ERROR_CHARS = 2000  # how much of an error the health and the crash event keep


@dataclass(frozen=True)
class LearnerHealth:
    state: str  # "starting" | "running" | "restarting" | "failed" | "stopped"
    restarts: int  # fresh actors started after a crash
    last_error: str | None  # why the last actor died (kept after a successful restart)


class LearnerUnavailable(RuntimeError):
    """The learner actor is not running (restarting, failed or stopped) or did not answer."""


class RayNotPrivate(RuntimeError):
    """The local Ray did not come up bound to loopback: refused rather than exposed."""


class LearnerActor:
    def __init__(
        self, store: StoreConfig, learner: LearnerConfig, segments: SegmentsConfig, critic: CriticConfig, base_model_dir: str,
        transport: TransportConfig | None = None,
    ):
        import torch

        from liveloop.learner.lanes import build_learner
        from liveloop.store import Store

        torch.set_num_threads(1)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s learner: %(message)s")
        self._stop = threading.Event()
        self.store = Store(store)
        self.learner = build_learner(
            learner, critic, Path(base_model_dir), transport, segments=segments,
            feedback=self.store.feedback, versions=self.store.versions, operator=self.store.operator, episodes=self.store.episodes,
        )

    def run(self, max_steps: int | None = None) -> LearnerStatus:
        self.learner.run(self._stop.is_set, max_steps)
        return self.status()

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()

    def status(self) -> LearnerStatus:
        return self.learner.status()


# -- the private local Ray -------------------------------------------------------------------------
def private_ray_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Token authentication unless the operator chose a mode; without a token of the operator's, a
    fresh one for this process (Ray's own default would write ~/.ray/auth_token with the umask's
    mode, often world-readable). Ray's processes inherit it from the environment."""
    mode = environ.setdefault("RAY_AUTH_MODE", "token")
    if mode.lower() == "token" and not (environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")):
        environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (::ffff:127.0.0.1, how dual-stack sockets show it)."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def start_private_ray(num_cpus: int = 2) -> Path:
    """Start a local, single-node Ray bound to loopback with token auth; returns its (0700) temp dir."""
    import ray
    import ray._private.ray_constants as ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    private_ray_env()
    # Ray read RAY_AUTH_MODE when it was imported: refresh its config and token cache (what
    # ray.init does itself when it turns token auth on by default)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    # a single-node cluster: Ray then resolves the node address to loopback instead of the routable
    # one, and GCS, raylet, object manager, workers and agents bind to it (they are handed the address)
    multi_node, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    # Ray opens its temp dir to everyone (0777); inside a 0700 one, other users reach neither its
    # sockets nor its logs
    temp_dir = owned_temp_dir("ray")  # a killed server's is swept by the next (liveloop/temp_dirs.py)
    try:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=True,
            _node_ip_address=LOOPBACK,
            _temp_dir=str(temp_dir / "ray"),
        )
        node_ip = ray._private.worker._global_node.node_ip_address
        if not is_loopback(node_ip):
            raise RayNotPrivate(f"the local Ray came up on {node_ip}, not on loopback")
    except BaseException:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
    return temp_dir


def _describe(exc: BaseException) -> str:
    """One line for an operator: the learner's own exception when run() raised, else Ray's."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError) and exc.cause is not None:
        exc = exc.cause
    return f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


def _position(status: LearnerStatus) -> dict[str, Any]:
    """Where a (re)started learner stands, for its event: a plain learner's cursor; each lane's with lanes."""
    if status.single is not None:
        return {"cursor": status.cursor}
    return {"cursors": {lane.segment: lane.cursor for lane in status.lanes}}


# -- the supervisor --------------------------------------------------------------------------------
class ColocatedLearner:
    """Starts the learner actor in a private local Ray, from the server process, and keeps it running."""

    def __init__(
        self,
        store: StoreConfig,
        learner: LearnerConfig,
        segments: SegmentsConfig,
        critic: CriticConfig,
        base_model_dir: Path,
        transport: TransportConfig | None = None,
        *,
        max_restarts: int = 5,
        restart_window_s: float = 600.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        start_timeout_s: float = 600.0,
        poll_s: float = 0.5,
    ):
        import ray

        from liveloop.store import Store

        self.max_restarts, self.restart_window_s = max_restarts, restart_window_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.start_timeout_s, self.poll_s = start_timeout_s, poll_s
        self._args = (store, learner, segments, critic, str(base_model_dir), transport)
        self._lock = threading.Lock()  # guards the actor handle, its run ref and the health
        self._closing = threading.Event()
        self._crashes: deque[float] = deque()
        self._health = LearnerHealth("starting", 0, None)
        self._owns_ray = not ray.is_initialized()
        self._ray_dir = start_private_ray() if self._owns_ray else None
        self._actor_cls = ray.remote(num_cpus=1, max_concurrency=4)(LearnerActor)
        try:
            # wait until the actor has loaded its models: once the server says healthy, the learner runs
            self._actor, self._run_ref, _ = self._start_actor()
        except BaseException:
            self._shutdown_ray()
            raise
        self._events = Store(store)
        self._health = LearnerHealth("running", 0, None)
        self._thread = threading.Thread(target=self._supervise, name="learner-supervisor", daemon=True)
        self._thread.start()

    # -- what the server calls ---------------------------------------------------------------
    def health(self) -> LearnerHealth:
        """The supervisor's view; never calls into the actor, never blocks."""
        return self._health

    @property
    def actor(self):  # noqa: ANN201 (a Ray actor handle)
        """The current actor's handle (a new one after each restart)."""
        return self._actor

    def status(self, timeout: float = 10) -> LearnerStatus:
        """The actor's own status (typed: it crosses Ray pickled as it is); raises LearnerUnavailable
        unless it is running and answers."""
        import ray
        from ray.exceptions import RayError

        health, actor = self._health, self._actor
        if health.state != "running":
            raise LearnerUnavailable(f"the learner is {health.state}" + (f": {health.last_error}" if health.last_error else ""))
        try:
            return ray.get(actor.status.remote(), timeout=timeout)
        except RayError as exc:
            raise LearnerUnavailable(f"the learner did not answer: {_describe(exc)}") from exc

    def close(self, timeout: float = 120) -> None:
        """Stop supervising, let the actor publish what is pending, shut the private Ray down."""
        import ray

        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._lock:
            actor, run_ref, state = self._actor, self._run_ref, self._health.state
        if state == "running":
            try:
                actor.stop.remote()
                ray.get(run_ref, timeout=timeout)  # publishes what is pending
            except Exception:
                log.exception("learner actor did not stop cleanly")
        self._kill(actor)
        with self._lock:
            self._health = LearnerHealth("stopped", self._health.restarts, self._health.last_error)
        self._events.close()
        self._shutdown_ray()

    # -- supervision -------------------------------------------------------------------------
    def _start_actor(self) -> tuple[Any, Any, LearnerStatus]:
        """A fresh actor (it resumes from the store), once it answers; its run() started."""
        import ray

        actor = self._actor_cls.remote(*self._args)
        ready = actor.status.remote()
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while not ray.wait([ready], timeout=self.poll_s)[0]:
                if self._closing.is_set():
                    raise LearnerUnavailable("closed while the learner was starting")
                if time.monotonic() > deadline:
                    raise LearnerUnavailable(f"the learner did not start within {self.start_timeout_s:.0f}s")
            status = ray.get(ready)
        except BaseException:
            self._kill(actor)
            raise
        return actor, actor.run.remote(), status

    def _supervise(self) -> None:
        import ray

        while not self._closing.is_set():
            with self._lock:
                run_ref = self._run_ref
            if not ray.wait([run_ref], timeout=self.poll_s)[0] or self._closing.is_set():
                continue
            try:
                ray.get(run_ref)
                error = "run() returned before close()"
            except Exception as exc:  # the worker died (RayActorError) or run() raised
                error = _describe(exc)
            if not self._recover(error):
                return

    def _recover(self, error: str) -> bool:
        """Record the crash and start fresh actors (backing off) until one runs; False: gave up or closing."""
        while not self._closing.is_set():
            now = time.monotonic()
            self._crashes.append(now)
            while now - self._crashes[0] > self.restart_window_s:
                self._crashes.popleft()
            with self._lock:
                restarts, old = self._health.restarts, self._actor
                self._health = LearnerHealth("restarting", restarts, error)
            log.error("learner actor crashed (%d restarts so far): %s", restarts, error)
            self._record("learner_crash", None, {"error": error, "restarts": restarts})
            self._kill(old)
            if len(self._crashes) > self.max_restarts:
                with self._lock:
                    self._health = LearnerHealth("failed", restarts, error)
                log.error("learner: %d crashes within %.0fs, giving up", len(self._crashes), self.restart_window_s)
                self._record("learner_failed", None, {"error": error, "restarts": restarts, "window_seconds": self.restart_window_s})
                return False
            delay = min(self.backoff_s * 2 ** (len(self._crashes) - 1), self.max_backoff_s)
            if self._closing.wait(delay):
                return False
            try:
                actor, run_ref, status = self._start_actor()
            except Exception as exc:
                if self._closing.is_set():
                    return False
                error = f"restart failed: {_describe(exc)}"
                continue
            with self._lock:  # if close() is waiting for this thread, it stops this fresh actor
                self._actor, self._run_ref = actor, run_ref
                self._health = LearnerHealth("running", restarts + 1, error)
            where = _position(status)
            log.warning("learner restarted (restart %d) at version %s, %s", restarts + 1, status.version, where)
            self._record("learner_restart", status.version, {"restarts": restarts + 1} | where)
            return True
        return False

    def _record(self, kind: str, version: int | None, detail: dict[str, Any]) -> None:
        try:
            self._events.operator.record_event(kind, version=version, detail=detail)
        except Exception:  # the store being down must not stop the supervision
            log.exception("could not record the operator event %s", kind)

    @staticmethod
    def _kill(actor: Any) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass

    def _shutdown_ray(self) -> None:
        import ray

        if self._owns_ray:
            ray.shutdown()
        if self._ray_dir is not None:
            shutil.rmtree(self._ray_dir, ignore_errors=True)
