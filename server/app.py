"""The FastAPI application and the serving components' lifecycle. Wired by `liveloop.app.build_app`
(the one place that builds the components and hands each what it needs, the learner included).

`running(config, model_dir)`, in order: 1. open the store and bring its schema to head (or refuse to
start); 2. find the serving version (the newest "serving" row, else version 0 = the configured model);
3. start the engine on that version's weights; 4. start the group-commit writer; 5. watch for versions
learners publish (every `[server] watch_seconds`) and the feedback stream for drift (`Operations`);
6. apply `[store] retain_days` periodically. On exit it reverses it: every queued row is flushed before
the process exits. `attach` puts the components (and the learner the wiring started, or None) on
`app.state`, where the routes find them; `create_app` builds the routes around the wiring's lifespan.

`check_bind` refuses, before anything starts, to listen beyond loopback with the shipped
development keys (they are public: anyone could use them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from liveloop.config import Config
from liveloop.learner.segments import lanes, segment_of
from liveloop.metrics import Metrics
from liveloop.server.admission import Admission
from liveloop.server.auth import KeyRing, Sessions
from liveloop.server.body import BodyLimit
from liveloop.server.config import ServerConfig
from liveloop.server.engines.base import Engine, create_engine
from liveloop.server.errors import install_handlers
from liveloop.server.operations import Operations
from liveloop.server.publisher import Publisher
from liveloop.server.startup import finish_start, start_point
from liveloop.server.routes import admin, dashboard, feedback, openai, ops
from liveloop.server.serving import Serving
from liveloop.store import BatchWriter, Store
from liveloop.transport import HandleGone, make_receiver

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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


async def apply_retention(store: Store, retain_days: float, interval: float) -> None:
    """Delete responses and ratings older than `retain_days`, every `interval` seconds, until cancelled."""
    while True:
        try:
            cutoff = datetime.now(timezone.utc) - timedelta(days=retain_days)
            deleted = await asyncio.to_thread(store.delete_before, cutoff)
            if deleted.responses:
                log.info("retention: deleted %d responses and %d ratings older than %s", deleted.responses, deleted.ratings, cutoff)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retention")
        await asyncio.sleep(interval)


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


async def start_components(config: Config, model_dir: Path) -> Components:
    from transformers import AutoTokenizer

    keys = KeyRing(config.auth)
    # 1. store
    store = Store(config.store)
    if config.store.auto_migrate:
        await asyncio.to_thread(store.migrate)
    await asyncio.to_thread(store.require_schema)
    # 2. serving version
    latest = await asyncio.to_thread(store.latest_version)
    if latest is None:
        latest = await asyncio.to_thread(store.ensure_base_version, str(model_dir.resolve()))
    # a version published in memory may not have its durable checkpoint yet: start from what exists
    transport = config.transport_for_store()
    receiver = make_receiver(transport) if transport.in_memory else None
    point = await start_point(store, latest, receiver, transport.durable_wait_seconds)
    # 3. engine (with room for every segment's adapter, and as many old ones finishing a response)
    segments = lanes(config.learner)
    engine_config = config.engine
    if segments and engine_config.max_adapters < 2 * len(segments):
        engine_config = replace(engine_config, max_adapters=2 * len(segments))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    engine = create_engine(engine_config, model_dir)
    await engine.start(version=point.start_version, weights_path=point.weights_path)
    # 4. writer
    writer = BatchWriter(store).start()
    metrics = Metrics()
    route = functools.partial(segment_of, config=config.learner)
    serving = Serving(engine, tokenizer, writer, metrics, config.server, config.engine, model_dir, Admission(config.server), route)
    publisher = Publisher(
        engine, store, metrics, config.learner.cursor_name, segments,
        receiver=receiver, durable_wait_seconds=transport.durable_wait_seconds,
    )
    try:
        await finish_start(publisher, point)
    except HandleGone:  # its memory went between the two looks: wait for the durable copy or fall back
        point = await start_point(store, latest, None, transport.durable_wait_seconds)
        if point.start_version != engine.version and point.weights_path:
            await engine.update_weights(point.weights_path, point.start_version)
    if segments:
        await publisher.restore_adapters()
    operations = Operations(config.monitor, store, publisher, metrics)
    return Components(store, writer, engine, tokenizer, metrics, keys, serving, publisher, operations)


async def stop_components(c: Components) -> None:
    await c.engine.close()
    await asyncio.to_thread(c.writer.close)
    c.store.close()


@contextlib.asynccontextmanager
async def running(config: Config, model_dir: Path) -> AsyncIterator[Components]:
    """The serving components, started, with their background tasks (the version watcher, operations,
    retention); on exit the tasks are cancelled and the components stopped, every queued row flushed."""
    c = await start_components(config, model_dir)
    watcher = asyncio.create_task(c.publisher.watch(config.server.watch_seconds))
    monitor = asyncio.create_task(c.operations.run()) if config.monitor.enabled else None
    retention = None
    if config.store.retain_days > 0:
        retention = asyncio.create_task(apply_retention(c.store, config.store.retain_days, config.store.retention_interval_seconds))
    log.info("serving %s version %d on %s", config.engine.served_model_name, c.engine.version, c.engine.name)
    try:
        yield c
    finally:
        for task in (watcher, monitor, retention):
            if task is not None:
                task.cancel()
        await stop_components(c)


def attach(app: FastAPI, c: Components, learner: Any | None) -> None:
    """Where the routes find what they use: each component on `app.state`, and the co-located learner
    (`health()`, `status()`; None when there is none) as `app.state.learner`."""
    for name, value in vars(c).items():
        setattr(app.state, name, value)
    app.state.started_at = int(time.time())
    app.state.learner = learner


def create_app(server: ServerConfig, lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]) -> FastAPI:
    """The routes, error handlers and body limit; `lifespan` (the wiring's) starts the components and
    `attach`es them before the first request."""
    app = FastAPI(title="liveloop", version="0.1.0", lifespan=lifespan)
    install_handlers(app)
    app.state.sessions = Sessions()
    app.include_router(openai.router)
    app.include_router(feedback.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.add_middleware(BodyLimit, max_bytes=server.max_body_bytes)
    return app
