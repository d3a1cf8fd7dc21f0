"""The composition root of `liveloop serve`: everything is built here, from the config, and each part
is handed only what it uses. Nothing else builds a component.

    app = build_app(config, model_dir)      # uvicorn runs it (liveloop/cli.py, `serve`)

`build_app` makes the HTTP edge's app (server/edge/app.py: routes only) with a lifespan that, in order:
1. opens the store and brings its schema to head (or refuses to start);
2. finds what serves (server/control/startup.py) and starts the engine on it (a `CanaryEngine` pair
   when the release gate runs);
3. starts the group-commit writer, the serving pipeline and the activation side of the control plane
   (`Activator`), restoring the segments' adapters; then a warm-up generation (nothing logged);
4. builds the control plane's loops' owners: `Operations`, `Leadership`, the release gate, the registry;
5. starts the background tasks (`running`): the version watcher, the heartbeat, the forgotten keys'
   refresh, the monitor, the alarms, the gate, retention, the leader lease, the fleet-wide limits' sync;
6. starts the co-located learner (`start_learner`, a Ray actor, when `[learner] enabled`: it meets the
   server only in the store), and the watch on its pace (`Operations.watch_pace`);
7. freezes the start's objects out of the garbage collector's full passes (`freeze_heap`), builds one
   handler per endpoint family with exactly its collaborators (`handlers_of`) and attaches them to the
   app (server/edge/dependencies.py). /healthz answers only then.
Shut-down reverses it: the learner first, then the tasks, the lease and the registry row, then the
engine, the writer (every queued row flushed) and the store.

A Ray Serve replica (liveloop/serve_ray.py) builds the same app with another `learner` factory: a view
of the ONE learner the fleet shares (`RemoteLearner`), whose `close` only stops looking at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from liveloop.config import Config
from liveloop.metrics import Metrics
from liveloop.segments import lanes, segment_of
from liveloop.server.control.fleet import heartbeat, replica_id
from liveloop.server.control.forgetting import Forgetting
from liveloop.server.control.gate import ReleaseGate, gated_segments, wants_gate
from liveloop.server.control.leader import Leadership
from liveloop.server.control.operations import Operations
from liveloop.server.control.activator import Activator
from liveloop.server.edge.pipeline.readiness import WarmUp, freeze_heap, thaw_heap, warm_up
from liveloop.server.control.retention import apply_retention
from liveloop.server.control.startup import finish_start, record_fallback, start_instead, start_point, sweep_shared_memory
from liveloop.server.control.weights_import import WeightImports
from liveloop.server.edge.admission import Admission
from liveloop.server.edge.app import check_bind, create_app
from liveloop.server.edge.admin.alarms import AdminAlarms
from liveloop.server.edge.admin.dashboard import Dashboard
from liveloop.server.edge.admin.episodes import AdminEpisodes
from liveloop.server.edge.admin.fleet import AdminFleet
from liveloop.server.edge.admin.keys import AdminKeys
from liveloop.server.edge.admin.learning import AdminLearning
from liveloop.server.edge.admin.release import AdminRelease
from liveloop.server.edge.admin.versions import AdminVersions
from liveloop.server.edge.auth import LoginThrottle, watch_forgotten
from liveloop.server.edge.chat.serving import ServingChat
from liveloop.server.edge.chat.stored import StoredChats
from liveloop.server.edge.completions.serving import ServingCompletions
from liveloop.server.edge.dependencies import EdgeState, Handlers, LearnerView, attach, detach, edge_state
from liveloop.server.edge.fleet_limits import FleetRateLimiter, fleet_view
from liveloop.server.edge.feedback.serving import ServingFeedback
from liveloop.server.edge.messages.serving import ServingMessages
from liveloop.server.edge.models.serving import ServingModels
from liveloop.server.edge.ops.serving import Ops
from liveloop.server.edge.ownership import Ownership
from liveloop.server.edge.pipeline.serving import Serving
from liveloop.server.edge.principal import KeyRing
from liveloop.server.edge.responses.serving import ServingResponses
from liveloop.server.edge.responses.stored import StoredResponses
from liveloop.server.edge.tokens.serving import ServingTokens
from liveloop.server.edge.versions.serving import ServingVersions
from liveloop.server.engines.base import Engine, create_engine
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.engines.registry import names_with
from liveloop.store import BatchWriter, Store
from liveloop.store.replicas import Beat
from liveloop.store.versions import VersionQueries
from liveloop.transport import HandleGone, WeightsUnverified, make_receiver

if TYPE_CHECKING:
    from liveloop.learner.actor import ColocatedLearner

log = logging.getLogger(__name__)
GATE_SECONDS = 0.5  # the release gate's pass at most this often (each reads the candidate's and live version's ratings)


def start_learner(config: Config, model_dir: Path) -> ColocatedLearner | None:
    """The co-located learner when `[learner] enabled` (it blocks until the actor has loaded its models),
    else None."""
    if not config.learner.enabled:
        return None
    from liveloop.learner.actor import ColocatedLearner

    return ColocatedLearner(config.store, config.learner, config.segments, config.critic, model_dir, config.transport_for_store())


def build_app(config: Config, model_dir: Path, learner_factory: Callable[[Config, Path], Any] = start_learner) -> FastAPI:
    """The FastAPI app of one deployment (or of one replica of it): the server's parts and the learner
    (`learner_factory`: the co-located one by default; None when off), wired together."""
    check_bind(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        edge = edge_state(app)
        async with running(config, model_dir, edge) as server:
            restore_stop_handlers = keep_stop_handlers()
            learner = await asyncio.to_thread(learner_factory, config, model_dir)
            restore_stop_handlers()  # Ray's driver put its own over them (keep_stop_handlers)
            # the learner's pace and its alarms read its status: watched once it is there
            pace = asyncio.create_task(server.operations.watch_pace(learner.status)) if learner is not None else None
            freeze_heap()  # what the start made stays out of the collector's full passes (server/edge/pipeline/readiness.py)
            attach(app, handlers_of(server, edge, learner), server.replica_id)
            app.state.server = server  # for Ray Serve's health check and tests' inspection: no route reads it
            try:
                yield
            finally:
                detach(app)
                app.state.server = None
                if pace is not None:
                    pace.cancel()
                if learner is not None:
                    await asyncio.to_thread(learner.close)
                thaw_heap()

    app = create_app(config.server, lifespan)
    app.state.server = None  # the running Server while the lifespan holds it (a Ray Serve replica's health check reads it)
    return app


def keep_stop_handlers() -> Callable[[], None]:
    """A function that puts back the SIGTERM and SIGINT handlers installed now. Ray's driver (`ray.init`,
    in the learner's start) installs its failure-signal handler over them: it logs the signal, calls the
    handler before it and then re-raises the signal with its default action, which killed `liveloop serve`
    in the middle of its orderly stop (exit -6, vLLM's engine core left running without it). Only on the
    main thread (where `liveloop serve` runs its event loop and `signal.signal` works); else a no-op."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)

    return restore


@dataclasses.dataclass(frozen=True)
class Server:
    """The server's parts, started (steps 1-4): what the background tasks run on and the handlers are
    built from (`handlers_of`). The composition root's own: nothing outside this module sees it whole."""

    store: Store
    writer: BatchWriter
    engine: Engine  # a CanaryEngine pair when gated
    tokenizer: Any
    metrics: Metrics
    keys: KeyRing
    login_throttle: LoginThrottle
    serving: Serving
    chat: ServingChat  # built first: the warm-up generates through it
    activator: Activator
    operations: Operations
    forgetting: Forgetting  # the server's one: one forget at a time moves learner cursors
    leadership: Leadership
    replica_id: str
    down_after_seconds: float
    gate: ReleaseGate | None = None
    started_at: int = 0
    warm_up: WarmUp | None = None  # the start's warm-up generation (server/edge/pipeline/readiness.py)


def handlers_of(s: Server, edge: EdgeState, learner: LearnerView | None) -> Handlers:
    """One handler per endpoint family, each with exactly its collaborators (the store's parts it
    reads, not the store)."""
    store, generating = s.store, edge.generating
    ownership = Ownership(store.conversations, store.rights, generating, s.serving.admission)
    return Handlers(
        keys=s.keys,
        chat=s.chat,
        stored_chats=StoredChats(store.conversations, ownership),
        completions=ServingCompletions(s.serving, generating),
        messages=ServingMessages(s.serving, generating),
        responses=ServingResponses(s.serving, generating, store.conversations),
        stored_responses=StoredResponses(ownership),
        tokens=ServingTokens(s.serving),
        feedback=ServingFeedback(s.serving.admission, s.writer, s.metrics, store.episodes),
        versions=ServingVersions(store.versions, store.fleet.registry, s.down_after_seconds, lambda: s.engine.version),
        models=ServingModels(s.serving, s.started_at),
        ops=Ops(s.writer, store.ping, s.engine, s.serving, s.metrics, store.fleet.registry, s.down_after_seconds, learner, s.warm_up),
        admin_versions=AdminVersions(s.operations, s.activator, s.engine, store.versions),
        admin_release=AdminRelease(s.gate, s.activator, s.engine, store.release, store.versions),
        admin_learning=AdminLearning(s.operations, s.activator, s.engine, s.tokenizer, s.serving.model_name, store.release,
                                     store.feedback, learner, s.started_at),
        admin_alarms=AdminAlarms(s.operations, store.operator),
        admin_keys=AdminKeys(s.operations, store.keys, store.rights, s.forgetting),
        admin_fleet=AdminFleet(store.fleet.registry, s.replica_id, s.down_after_seconds, store.operator),
        admin_episodes=AdminEpisodes(store.episodes),
        dashboard=Dashboard(s.keys, s.login_throttle, edge.sessions),
    )


async def start_parts(config: Config, model_dir: Path, edge: EdgeState) -> Server:
    """Steps 1-4: the server's parts, started (no background task yet)."""
    from transformers import AutoTokenizer

    KeyRing(config.auth)  # no keys: refused before anything opens
    # 1. store (and the keys it says were forgotten)
    store = Store(config.store)
    if config.store.auto_migrate:
        await asyncio.to_thread(store.migrate)
    await asyncio.to_thread(store.require_schema)
    await asyncio.to_thread(store.rights.forgotten.refresh)
    keys = KeyRing(config.auth, forgotten=store.rights.forgotten)
    # 2. what serves; a version published in memory may not have its durable checkpoint yet: start from what exists
    latest = await asyncio.to_thread(store.versions.latest_version)
    if latest is None:
        latest = await asyncio.to_thread(store.versions.ensure_base_version, str(model_dir.resolve()))
    transport = await asyncio.to_thread(config.transport_for_store)  # checkpoint_dir where shared memory cannot be had
    await asyncio.to_thread(record_fallback, store.operator, config.transport, transport)
    receiver = make_receiver(transport) if transport.in_memory else None
    point = await start_point(store.versions, latest, receiver, transport.durable_wait_seconds)
    # the engine, with room for every segment's adapter and as many old ones finishing a response (a gated
    # segment's candidate slot too, and its old one finishing)
    segments = lanes(config.segments)
    engine_config = config.engine
    room = 2 * len(segments) + 2 * len(gated_segments(config.release, segments, config.engine.backend))
    if segments and engine_config.max_adapters < room:
        engine_config = dataclasses.replace(engine_config, max_adapters=room)
    if segments and engine_config.max_lora_rank < config.learner.lora.rank:  # the engine's LoRA buffers fit what it trains
        engine_config = dataclasses.replace(engine_config, max_lora_rank=config.learner.lora.rank)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    engine = create_engine(engine_config, model_dir)
    gated = wants_gate(config.release, segments, config.engine.backend)
    if gated:  # a second engine of the same backend holds the candidate, started at the first one
        engine = CanaryEngine(engine, functools.partial(create_engine, engine_config, model_dir), engine_config.drain_deadline_seconds)
    await engine.start(version=point.start_version, weights_path=point.weights_path)
    if gated and engine_config.backend in names_with("blocking_start"):
        assert isinstance(engine, CanaryEngine)
        await engine.prepare()  # vLLM's start blocks the event loop: before serving, not at the first candidate
    # 3. writer, serving pipeline, activation
    writer = BatchWriter(store).start()
    metrics = Metrics()
    if not config.ray.enabled:  # a fleet's driver sweeps once, before its replicas start: a replica that
        # restarts while the learner writes a version must not remove it as "unfinished" (liveloop/serve_ray.py)
        await asyncio.to_thread(sweep_shared_memory, store.versions, store.operator, transport, metrics)  # what this deployment left there
    route = functools.partial(segment_of, config=config.segments, key=config.server.segment_key)
    fleet = fleet_view(config.server, store.fleet.counts, replica_id(config.server.replica_id))  # fleet-wide limits (None: per replica)
    admission = Admission(config.server, fleet, stored=store.keys.stored_bytes)
    serving = Serving(engine, tokenizer, writer, metrics, config.server, config.engine, model_dir, admission, route,
                      carried=store.episodes.carried_turn, canary_by=config.release.canary_by)
    activator = Activator(
        engine, store.versions, store.operator, metrics, config.learner.cursor_name, segments,
        receiver=receiver, durable_wait_seconds=transport.durable_wait_seconds,
        keep_serving_memory=config.ray.enabled,  # the other replicas still swap the serving version in from memory
        gate_base=config.release.mode != "immediate",
    )
    try:
        await finish_start(activator, point)
    except (HandleGone, WeightsUnverified):  # its memory went (or changed) between the two looks: durable copy or fall back
        await start_instead(activator, await start_point(store.versions, latest, None, transport.durable_wait_seconds))
    if segments:
        await activator.restore_adapters()
    # 4. the control plane's owners
    imports = WeightImports(config.learner.checkpoint_dir, model_dir, config.server.max_import_bytes)
    name = replica_id(config.server.replica_id)
    leadership = Leadership(store.fleet.leases, name, config.server.leader_lease_seconds, metrics)
    operations = Operations(
        config.monitor, activator, metrics, imports,
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
        alarms=config.release.alarms, tokenizer=tokenizer, leader=leadership.held_term, max_step_kl=config.learner.max_step_kl,
    )
    forgetting = Forgetting(activator, rights=store.rights, versions=store.versions, feedback=store.feedback, operator=store.operator)
    gate = None
    if gated:
        assert isinstance(engine, CanaryEngine)
        evaluate = evaluator(config, tokenizer, model_dir, serving.stop_token_ids, store.versions)
        gate = ReleaseGate(
            config.release, activator, engine, store.versions, store.operator, store.release, metrics, evaluate, leader=leadership.held_term,
        )
        serving.canary = gate.routes_to_candidate
    return Server(
        store=store, writer=writer, engine=engine, tokenizer=tokenizer, metrics=metrics, keys=keys, serving=serving,
        chat=ServingChat(serving, edge.generating),
        login_throttle=LoginThrottle(
            config.server.login_failures_per_minute, config.server.login_failures_per_minute_total, FleetRateLimiter(fleet),
        ),
        activator=activator, operations=operations, forgetting=forgetting, leadership=leadership, replica_id=name,
        down_after_seconds=config.server.down_after_seconds, gate=gate, started_at=int(time.time()),
    )


def evaluator(config: Config, tokenizer: Any, model_dir: Path, stop_token_ids: tuple[int, ...], versions: VersionQueries) -> Any:
    """The gate's `evaluate(candidate_engine, candidate, live_engine, live)`: the evaluation suite
    (release/evaluation.py) sampling through the engines (server/control/evaluating.py); None with
    `[release.evaluation]` off."""
    if not config.release.evaluation.enabled:
        return None
    from liveloop.release.evaluation import Evaluator
    from liveloop.server.control.evaluating import engine_evaluation

    suite = Evaluator(config.release.evaluation, tokenizer, model_dir, stop_token_ids=stop_token_ids, refresh=versions.get_version)
    return engine_evaluation(suite, stop_token_ids)


def beat_of(server: Server) -> Callable[[], Beat]:
    """What this replica reports in the registry: its serving versions, generations running and health."""

    def beat() -> Beat:
        adapters = {segment: server.engine.adapter_version(segment) for segment in server.activator.segments}
        healthy = server.engine.healthy() and server.writer.health().alive
        return Beat(server.engine.version, adapters, server.serving.admission.total, healthy)

    return beat


async def stop_parts(server: Server) -> None:
    await server.engine.close()
    server.serving.close()
    await asyncio.to_thread(server.writer.close)
    server.store.close()


@contextlib.asynccontextmanager
async def running(config: Config, model_dir: Path, edge: EdgeState) -> AsyncIterator[Server]:
    """Step 5: the server's parts, started, with their background tasks; on exit the tasks are cancelled,
    the lease released, the replica row removed and the parts stopped, every queued row flushed."""
    p = await start_parts(config, model_dir, edge)
    # a first generation through the pipeline before anything answers: the first reply is as fast as the second
    p = dataclasses.replace(p, warm_up=await warm_up(p.serving, p.chat.prepare_unlogged))
    try:  # lead at once if nobody does (a lone server): the loops below start as the leader
        await asyncio.to_thread(p.leadership.renew)
    except Exception:
        log.exception("leader lease")
    kind = "ray_serve" if config.ray.enabled else "process"
    tasks = [
        p.leadership.run(),
        p.activator.watch(config.server.watch_seconds),
        heartbeat(p.store.fleet.registry, p.replica_id, kind, beat_of(p), config.server.watch_seconds, config.server.heartbeat_seconds),
        watch_forgotten(p.store.rights.forgotten),
        p.operations.watch_alarms(),  # returns at once with [release.alarms] off
    ]
    if config.monitor.enabled:
        tasks.append(p.operations.run())
    if p.gate is not None:
        tasks.append(p.gate.run(max(config.server.watch_seconds, GATE_SECONDS)))
    if config.store.retain_days > 0:
        tasks.append(apply_retention(p.store.rights, config.store.retain_days, config.store.retention_interval_seconds, p.leadership.held_term))
    if p.serving.admission.fleet is not None:  # the fleet-wide limits' sync (a last one when cancelled)
        tasks.append(p.serving.admission.fleet.run())
    started = [asyncio.create_task(t) for t in tasks]
    log.info("serving %s version %d on %s", config.engine.served_model_name, p.engine.version, p.engine.name)
    try:
        yield p
    finally:
        for task in started:
            task.cancel()
        try:
            await asyncio.to_thread(p.leadership.release)  # the next replica leads at its next try
        except Exception:
            log.exception("releasing the leader lease")
        try:
            await asyncio.to_thread(p.store.fleet.registry.remove, p.replica_id)  # a clean stop leaves the fleet
        except Exception:
            log.exception("removing replica %s from the registry", p.replica_id)
        await stop_parts(p)
