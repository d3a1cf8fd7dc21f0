"""The FastAPI application and the serving components' lifecycle. Wired by `liveloop.app.build_app`
(the one place that builds the components and hands each what it needs, the learner included).

`running(config, model_dir)`, in order: 1. open the store and bring its schema to head (or refuse to
start); 2. find the serving version (the newest "serving" row, else version 0 = the configured model);
3. start the engine on that version's weights; 4. start the group-commit writer; 5. watch for versions
learners publish (every `[server] watch_seconds`) and the feedback stream for drift (`Operations`);
6. apply `[store] retain_days` periodically, and judge the live stream for reward hacking
(`[release.alarms]`, `Operations.watch_alarms`); 7. with `[release] mode` canary or gated, or
`[release.evaluation] immediate` on (`wants_gate`), run the release gate (server/control/gate.py) over a `CanaryEngine` (a second engine of the
same backend holds the candidate). On exit it reverses it: every queued row is flushed before
the process exits. `attach` puts the components (and the learner the wiring started, or None) on
`app.state`, where the routes find them; `create_app` builds the routes around the wiring's lifespan.

Every serving process is a replica of the fleet (one, for a plain `liveloop serve`; N Ray Serve
replicas with `[ray] enabled`, liveloop/serve_ray.py): `running` registers it in the store's replica
registry (store/replicas.py) under `replica_id(config)` and `heartbeat` rewrites its row (serving
versions, generations running, health) at once when what it serves changes, checked every
`[server] watch_seconds`, else every `[ray] heartbeat_seconds`; a clean stop removes it. Every
response names its replica in `x-liveloop-replica` (`ReplicaHeader`). One replica leads the fleet
(`Leadership`, server/control/leader.py: the store's leader lease, taken before the loops start and renewed by
its own task; released at a clean stop): the release gate's decisions and evaluations, the alarms, the
guard, the quarantine and retention write from the leader alone; every replica routes.

Requests reach the routes only with a Host header `[server] allowed_hosts` allows (`HostAllowList`,
server/edge/hosts.py: DNS rebinding). The forgotten keys the edge refuses (or serves unstored) are re-read
from the store every `FORGOTTEN_REFRESH_SECONDS` off the event loop (`watch_forgotten`).

`check_bind` refuses, before anything starts, to listen beyond loopback with the shipped
development keys (they are public: anyone could use them).

Slow clients cannot hold connections: `create_app` bounds a request body's arrival
(`[server] body_timeout_seconds`, 408), and `uvicorn_options` gives uvicorn what bounds the headers'
(`[server] header_timeout_seconds`): uvicorn's h11 protocol has no header timeout (a connection that
sends half a request line is kept for ever), so `HeaderDeadline` is h11's protocol with one timer,
armed when a connection opens and after each response, cancelled once a request's headers are in,
closing the connection when it fires first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import h11
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from liveloop.config import Config
from liveloop.segments import lanes, segment_of
from liveloop.metrics import Metrics
from liveloop.server.edge.admission import Admission
from liveloop.server.edge.auth import KeyRing, LoginThrottle, Sessions
from liveloop.server.edge.body import BodyDeadline, BodyLimit
from liveloop.server.config import ServerConfig
from liveloop.server.engines.base import Engine, create_engine
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.edge.errors import install_handlers
from liveloop.server.control.gate import ReleaseGate, gated_segments
from liveloop.server.edge.hosts import HostAllowList, allowed_hosts
from liveloop.server.control.leader import Leadership
from liveloop.server.control.operations import Operations
from liveloop.server.control.publisher import Publisher
from liveloop.server.control.startup import finish_start, record_fallback, start_point, sweep_shared_memory
from liveloop.server.edge import models, ops
from liveloop.server.edge.admin import alarms, api_docs, dashboard, episodes, release
from liveloop.server.edge.admin import routes as admin
from liveloop.server.edge.chat import routes as chat, stored
from liveloop.server.edge.completions import routes as completions
from liveloop.server.edge.feedback import routes as feedback
from liveloop.server.edge.messages import routes as messages
from liveloop.server.edge.pipeline.streaming import Generating
from liveloop.server.edge.responses import routes as responses
from liveloop.server.edge.tokens import routes as tokens
from liveloop.server.edge.pipeline.serving import Serving
from liveloop.server.control.weights_import import WeightImports
from liveloop.store import BatchWriter, Store
from liveloop.store.replicas import Beat, ReplicaRegistry
from liveloop.transport import HandleGone, WeightsUnverified, make_receiver

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
FORGOTTEN_REFRESH_SECONDS = 1.0  # how often the edge re-reads the forgotten keys (another process may forget one)
GATED_BACKENDS = ("hf", "vllm")  # the backends the release gate runs on
GATE_SECONDS = 0.5  # the release gate's pass at most this often (each reads the candidate's and live version's ratings)


class UnsafeBind(ValueError):
    """The server would listen beyond loopback with the public development keys."""


def check_bind(config: Config) -> None:
    host = config.server.host
    if host in LOOPBACK or host.startswith("127."):
        return
    if (config.auth.dev_user_keys or config.auth.dev_admin_keys) and not config.server.allow_dev_keys_on_public_bind:
        raise UnsafeBind(
            f"server.host = {host!r} listens beyond loopback, but auth.dev_user_keys / auth.dev_admin_keys hold the "
            "shipped development keys, which anyone can read: remove them and pass keys in "
            f"{config.auth.user_keys_env} / {config.auth.admin_keys_env} (or auth.*_key_sha256), "
            "or listen on 127.0.0.1"
        )


async def apply_retention(store: Store, retain_days: float, interval: float, leader: Callable[[], bool] = lambda: True) -> None:
    """Delete responses and ratings older than `retain_days`, every `interval` seconds while this replica
    leads (`leader`), until cancelled."""
    while True:
        try:
            if not leader():
                await asyncio.sleep(interval)
                continue
            cutoff = datetime.now(timezone.utc) - timedelta(days=retain_days)
            deleted = await asyncio.to_thread(store.delete_before, cutoff)
            if deleted.responses:
                log.info("retention: deleted %d responses and %d ratings older than %s", deleted.responses, deleted.ratings, cutoff)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retention")
        await asyncio.sleep(interval)


async def watch_forgotten(store: Store, interval: float = FORGOTTEN_REFRESH_SECONDS) -> None:
    """Re-read the forgotten keys every `interval` seconds (off the loop), until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(store.forgotten.refresh)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading the forgotten keys")


@functools.cache
def _process_name() -> str:
    return f"replica-{secrets.token_hex(6)}"


def replica_id(config: Config) -> str:
    """This process's name in the replica registry and in every response's `x-liveloop-replica`:
    `[ray] replica_id`, or ("auto") a random name drawn once per process. The name says nothing about
    the machine: its host and pid are in the registry row, which only operators read
    (`/admin/replicas`)."""
    return _process_name() if config.ray.replica_id == "auto" else config.ray.replica_id


async def heartbeat(c: Components, config: Config) -> None:
    """Register this replica, then rewrite its row whenever what it serves (or its health) changes,
    looked at every `[server] watch_seconds`, and at least every `[ray] heartbeat_seconds`; until
    cancelled. A store that does not answer is logged and tried again (the row then ages to "down")."""
    kind = "ray_serve" if config.ray.enabled else "process"
    last: Beat | None = None
    written = 0.0
    registered = False
    while True:
        try:
            beat = c.beat()
            now = time.monotonic()
            if not registered:
                await asyncio.to_thread(c.registry.register, c.replica_id, kind, socket.gethostname(), os.getpid(), beat)
                registered, last, written = True, beat, now
            elif beat != last or now - written >= config.ray.heartbeat_seconds:
                registered = await asyncio.to_thread(c.registry.beat, c.replica_id, beat)
                last, written = beat, now
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("replica heartbeat")
        await asyncio.sleep(config.server.watch_seconds)


@dataclass
class Components:
    store: Store
    writer: BatchWriter
    engine: Engine
    tokenizer: Any
    metrics: Metrics
    keys: KeyRing
    serving: Serving
    publisher: Publisher
    operations: Operations
    registry: ReplicaRegistry
    replica_id: str
    down_after_seconds: float
    gate: ReleaseGate | None = None  # the release gate (None: immediate mode without evaluation)
    leadership: Leadership | None = None  # this replica's hold on the fleet's leader lease (server/control/leader.py)

    def beat(self) -> Beat:
        """What this replica reports: its serving versions, generations running and health."""
        adapters = {segment: self.engine.adapter_version(segment) for segment in self.publisher.segments}
        healthy = self.engine.healthy() and self.writer.health().alive
        return Beat(self.engine.version, adapters, self.serving.admission.total, healthy)


async def start_components(config: Config, model_dir: Path) -> Components:
    from transformers import AutoTokenizer

    KeyRing(config.auth)  # no keys: refused before anything opens
    # 1. store (and the keys it says were forgotten)
    store = Store(config.store)
    if config.store.auto_migrate:
        await asyncio.to_thread(store.migrate)
    await asyncio.to_thread(store.require_schema)
    await asyncio.to_thread(store.forgotten.refresh)
    keys = KeyRing(config.auth, forgotten=store.forgotten)
    # 2. serving version
    latest = await asyncio.to_thread(store.latest_version)
    if latest is None:
        latest = await asyncio.to_thread(store.ensure_base_version, str(model_dir.resolve()))
    # a version published in memory may not have its durable checkpoint yet: start from what exists
    transport = await asyncio.to_thread(config.transport_for_store)  # checkpoint_dir where shared memory cannot be had
    await asyncio.to_thread(record_fallback, store, config.transport, transport)
    receiver = make_receiver(transport) if transport.in_memory else None
    point = await start_point(store, latest, receiver, transport.durable_wait_seconds)
    # 3. engine (with room for every segment's adapter, and as many old ones finishing a response; a
    # gated segment's candidate slot too, and its old one finishing)
    segments = lanes(config.learner)
    engine_config = config.engine
    room = 2 * len(segments) + 2 * len(gated_segments(config.release, segments, config.engine.backend))
    if segments and engine_config.max_adapters < room:
        engine_config = replace(engine_config, max_adapters=room)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    engine = create_engine(engine_config, model_dir)
    gated = wants_gate(config)
    if gated:  # a second engine of the same backend holds the candidate, started at the first one
        engine = CanaryEngine(engine, functools.partial(create_engine, engine_config, model_dir), engine_config.drain_deadline_seconds)
    await engine.start(version=point.start_version, weights_path=point.weights_path)
    if gated and engine_config.backend == "vllm":
        assert isinstance(engine, CanaryEngine)
        await engine.prepare()  # vLLM's start blocks the event loop: before serving, not at the first candidate
    # 4. writer
    writer = BatchWriter(store).start()
    metrics = Metrics()
    if not config.ray.enabled:  # a fleet's driver sweeps once, before its replicas start: a replica that
        # restarts while the learner writes a version must not remove it as "unfinished" (liveloop/serve_ray.py)
        await asyncio.to_thread(sweep_shared_memory, store, transport, metrics)  # what this deployment left there
    route = functools.partial(segment_of, config=config.learner)
    serving = Serving(engine, tokenizer, writer, metrics, config.server, config.engine, model_dir, Admission(config.server), route,
                      carried=store.episodes.carried_turn, canary_by=config.release.canary_by)
    publisher = Publisher(
        engine, store, metrics, config.learner.cursor_name, segments,
        receiver=receiver, durable_wait_seconds=transport.durable_wait_seconds,
        keep_serving_memory=config.ray.enabled,  # the other replicas still swap the serving version in from memory
        gate_base=config.release.mode != "immediate",
    )
    try:
        await finish_start(publisher, point)
    except (HandleGone, WeightsUnverified):  # its memory went (or changed) between the two looks: durable copy or fall back
        point = await start_point(store, latest, None, transport.durable_wait_seconds)
        if point.start_version != engine.version and point.weights_path:
            await engine.update_weights(point.weights_path, point.start_version)
    if segments:
        await publisher.restore_adapters()
    imports = WeightImports(config.learner.checkpoint_dir, model_dir, config.server.max_import_bytes)
    leadership = Leadership(store, replica_id(config), config.ray.leader_lease_seconds, metrics)
    operations = Operations(
        config.monitor, store, publisher, metrics, imports, alarms=config.release.alarms, tokenizer=tokenizer, leader=leadership.held_term,
    )
    registry = ReplicaRegistry(store)
    gate = None
    if gated:
        assert isinstance(engine, CanaryEngine)
        evaluate = evaluator(config, tokenizer, model_dir, serving.stop_token_ids, store)
        gate = ReleaseGate(config.release, publisher, engine, store, metrics, evaluate, leader=leadership.held_term)
        serving.canary = gate.routes_to_candidate
    return Components(
        store, writer, engine, tokenizer, metrics, keys, serving, publisher, operations, registry, replica_id(config),
        config.ray.down_after_seconds, gate, leadership,
    )


def wants_gate(config: Config) -> bool:
    """Whether this server runs the release gate (and so a candidate engine): a canary or gated mode, or
    immediate mode with `[release.evaluation] immediate` on (each new serving version evaluated, gating
    nothing), or a segment adapter lineage in a canary or gated mode. Refuses a gated mode on the other
    backends (sglang's engine is a client of one SGLang server: a second one would share its weights; a
    diffusion model is not a causal LM the evaluation can score), and a gated segment on a backend
    without adapter slots (server/control/gate.py `gated_segments`: a ConfigError)."""
    evaluates_immediate = config.release.evaluation.enabled and config.release.evaluation.immediate
    if config.engine.backend not in GATED_BACKENDS:
        if config.release.mode != "immediate" or evaluates_immediate:
            raise ValueError(
                f"[release] mode = {config.release.mode!r} (or an evaluation in immediate mode) needs a second engine for the "
                f"candidate and a causal LM to evaluate: backends {', '.join(GATED_BACKENDS)}, not {config.engine.backend}"
            )
        gated_segments(config.release, lanes(config.learner), config.engine.backend)  # raises for a gated segment
        return False
    segments = gated_segments(config.release, lanes(config.learner), config.engine.backend)
    return config.release.mode != "immediate" or evaluates_immediate or bool(segments)


def evaluator(config: Config, tokenizer: Any, model_dir: Path, stop_token_ids: tuple[int, ...], store: Store) -> Any:
    """The gate's `evaluate(candidate_engine, candidate, live_engine, live)`: the evaluation suite
    (release/evaluation.py) sampling through the engines (server/control/evaluating.py); None with
    `[release.evaluation]` off."""
    if not config.release.evaluation.enabled:
        return None
    from liveloop.release.evaluation import Evaluator
    from liveloop.server.control.evaluating import engine_evaluation

    suite = Evaluator(config.release.evaluation, tokenizer, model_dir, stop_token_ids=stop_token_ids, refresh=store.get_version)
    return engine_evaluation(suite, stop_token_ids)


async def stop_components(c: Components) -> None:
    await c.engine.close()
    c.serving.close()
    await asyncio.to_thread(c.writer.close)
    c.store.close()


@contextlib.asynccontextmanager
async def running(config: Config, model_dir: Path) -> AsyncIterator[Components]:
    """The serving components, started, with their background tasks (the version watcher, operations,
    retention); on exit the tasks are cancelled and the components stopped, every queued row flushed."""
    c = await start_components(config, model_dir)
    assert c.leadership is not None
    try:  # lead at once if nobody does (a lone server): the loops below start as the leader
        await asyncio.to_thread(c.leadership.renew)
    except Exception:
        log.exception("leader lease")
    leader = asyncio.create_task(c.leadership.run())
    watcher = asyncio.create_task(c.publisher.watch(config.server.watch_seconds))
    beats = asyncio.create_task(heartbeat(c, config))
    forgotten = asyncio.create_task(watch_forgotten(c.store))
    monitor = asyncio.create_task(c.operations.run()) if config.monitor.enabled else None
    alarms = asyncio.create_task(c.operations.watch_alarms())  # returns at once with [release.alarms] off
    gate = asyncio.create_task(c.gate.run(max(config.server.watch_seconds, GATE_SECONDS))) if c.gate is not None else None
    retention = None
    if config.store.retain_days > 0:
        retention = asyncio.create_task(apply_retention(
            c.store, config.store.retain_days, config.store.retention_interval_seconds, c.leadership.leading,
        ))
    log.info("serving %s version %d on %s", config.engine.served_model_name, c.engine.version, c.engine.name)
    try:
        yield c
    finally:
        for task in (watcher, gate, beats, forgotten, monitor, alarms, retention, leader):
            if task is not None:
                task.cancel()
        try:
            await asyncio.to_thread(c.leadership.release)  # the next replica leads at its next try
        except Exception:
            log.exception("releasing the leader lease")
        try:
            await asyncio.to_thread(c.registry.remove, c.replica_id)  # a clean stop leaves the fleet
        except Exception:
            log.exception("removing replica %s from the registry", c.replica_id)
        await stop_components(c)


def attach(app: FastAPI, c: Components, learner: Any | None) -> None:
    """Where the routes find what they use: each component on `app.state`, and the co-located learner
    (`health()`, `status()`; None when there is none) as `app.state.learner`."""
    for name, value in vars(c).items():
        setattr(app.state, name, value)
    app.state.started_at = int(time.time())
    app.state.learner = learner
    app.state.replica = c.replica_id


def create_app(server: ServerConfig, lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]) -> FastAPI:
    """The routes, error handlers, body limit and Host allow-list; `lifespan` (the wiring's) starts the
    components and `attach`es them before the first request."""
    app = FastAPI(title="liveloop", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    app.state.sessions = Sessions()
    app.state.login_throttle = LoginThrottle(server.login_failures_per_minute, server.login_failures_per_minute_total)
    app.state.ops_open_on_loopback = server.ops_open_on_loopback
    app.state.generating = Generating()
    app.include_router(models.router)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(stored.router)
    app.include_router(messages.router)
    app.include_router(responses.router)
    app.include_router(tokens.router)
    app.include_router(feedback.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(episodes.router)
    app.include_router(dashboard.router)
    app.include_router(release.router)
    app.include_router(alarms.router)
    app.include_router(api_docs.router)  # behind the admin key, not FastAPI's public defaults
    app.add_middleware(BodyDeadline, seconds=server.body_timeout_seconds)
    app.add_middleware(BodyLimit, max_bytes=server.max_body_bytes)
    app.add_middleware(ReplicaHeader, app_state=app.state)
    app.add_middleware(HostAllowList, entries=allowed_hosts(server))  # the outermost: nothing runs for a wrong Host
    return app


class ReplicaHeader:
    """Names the replica that answered in `x-liveloop-replica` (pure ASGI: streams pass untouched)."""

    def __init__(self, app: Any, app_state: Any):
        self.app, self.state = app, app_state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        replica = getattr(self.state, "replica", None)
        if scope["type"] != "http" or replica is None:
            await self.app(scope, receive, send)
            return
        header = (b"x-liveloop-replica", replica.encode())

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app(scope, receive, send_named)


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete within
    `header_timeout` seconds of its opening, or of the first byte of a later request on it. Between
    requests an idle connection is uvicorn's: `timeout_keep_alive` (`[server] keep_alive_seconds`) closes
    it. That idle limit sits well above the clients' own pool expiry (httpx's 5 s): a server that closes
    an idle connection at the instant a client reuses it drops that client's request (the client sees a
    read error, and a POST is not retried), so the client must always be the one to give up first."""

    header_timeout = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # a request's headers are in
            self._cancel_header_timer()
        elif self._header_timer is None and not self.transport.is_closing():  # a later request has begun
            self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request at once
        pipelined = bool(self.conn.trailing_data[0])  # part of the next request came with the last one
        if pipelined and not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(server: ServerConfig) -> dict[str, Any]:
    """What `uvicorn.run` needs besides the app, host and port to bound slow clients."""
    protocol = type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": server.header_timeout_seconds})
    return {"http": protocol, "timeout_keep_alive": server.keep_alive_seconds, "log_level": server.log_level}
