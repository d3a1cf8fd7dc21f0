"""The FastAPI application and its lifecycle.

Start-up, in order: 1. open the store and bring its schema to head (or refuse to start); 2. find the
serving version (the newest "serving" row, else version 0 = the configured model); 3. start the engine
on that version's weights; 4. start the group-commit writer; 5. watch for versions learners publish
and the feedback stream for drift (`Operations`);
6. start the co-located learner (a Ray actor) when `[learner] enabled`. Shut-down reverses it: the
learner publishes what it has, and every queued row is flushed before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from liveloop.config import Config
from liveloop.metrics import Metrics
from liveloop.server.auth import KeyRing, Sessions
from liveloop.server.body import BodyLimit
from liveloop.server.engines.base import Engine, create_engine
from liveloop.server.errors import install_handlers
from liveloop.server.operations import Operations
from liveloop.server.publisher import Publisher
from liveloop.server.routes import admin, dashboard, feedback, openai, ops
from liveloop.server.serving import Serving
from liveloop.store import BatchWriter, Store

log = logging.getLogger(__name__)


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
    weights = latest.checkpoint_path if latest.version > 0 else None
    # 3. engine
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    engine = create_engine(config.engine, model_dir)
    await engine.start(version=latest.version, weights_path=weights)
    # 4. writer
    writer = BatchWriter(store).start()
    metrics = Metrics()
    serving = Serving(engine, tokenizer, writer, metrics, config.server, config.engine, model_dir)
    publisher = Publisher(engine, store, metrics, config.learner.cursor_name)
    operations = Operations(config.monitor, store, publisher, metrics)
    return Components(store, writer, engine, tokenizer, metrics, keys, serving, publisher, operations)


async def stop_components(c: Components) -> None:
    await c.engine.close()
    await asyncio.to_thread(c.writer.close)
    c.store.close()


def create_app(config: Config, model_dir: Path) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        c = await start_components(config, model_dir)
        for name, value in vars(c).items():
            setattr(app.state, name, value)
        app.state.started_at = int(time.time())
        app.state.learner = None
        watcher = asyncio.create_task(c.publisher.watch(config.learner.poll_seconds))
        monitor = asyncio.create_task(c.operations.run()) if config.monitor.enabled else None
        log.info("serving %s version %d on %s", config.engine.served_model_name, c.engine.version, c.engine.name)
        try:
            if config.learner.enabled:
                from liveloop.learner.actor import ColocatedLearner

                app.state.learner = await asyncio.to_thread(
                    ColocatedLearner, config.store, config.learner, config.critic, model_dir
                )
            yield
        finally:
            if app.state.learner is not None:
                await asyncio.to_thread(app.state.learner.close)
            watcher.cancel()
            if monitor is not None:
                monitor.cancel()
            await stop_components(c)

    app = FastAPI(title="liveloop", version="0.1.0", lifespan=lifespan)
    install_handlers(app)
    app.state.sessions = Sessions()
    app.include_router(openai.router)
    app.include_router(feedback.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.add_middleware(BodyLimit, max_bytes=config.server.max_body_bytes)
    return app
