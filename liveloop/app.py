"""The one wiring place of `liveloop serve`: builds the components from the config and hands each only
what it needs.

    app = build_app(config, model_dir)      # uvicorn runs it (liveloop/cli.py, `serve`)

- the server (`liveloop.server.app.running`) gets the deployment config and the model directory and
  starts what serves: store, engine, writer, version watcher, operations, retention;
- the co-located learner (`start_learner`, a Ray actor, when `[learner] enabled`) gets `[store]`,
  `[learner]`, `[critic]` and the model directory; it finds the server only through the store;
- the routes find both on `app.state` (`attach`): `app.state.learner` is the learner, or None.

Start-up: the server's components, then the learner (so /healthz answers only once both run);
shut-down: the learner first (it publishes what it has), then the server's components.

A Ray Serve replica (liveloop/serve_ray.py) builds the same app with another `learner` factory: a view
of the ONE learner the fleet shares (`RemoteLearner`), whose `close` only stops looking at it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from liveloop.config import Config
from liveloop.server.app import attach, check_bind, create_app, running

if TYPE_CHECKING:
    from liveloop.learner.actor import ColocatedLearner


def start_learner(config: Config, model_dir: Path) -> ColocatedLearner | None:
    """The co-located learner when `[learner] enabled` (it blocks until the actor has loaded its models),
    else None."""
    if not config.learner.enabled:
        return None
    from liveloop.learner.actor import ColocatedLearner

    return ColocatedLearner(config.store, config.learner, config.critic, model_dir, config.transport_for_store())


def build_app(config: Config, model_dir: Path, learner_factory: Callable[[Config, Path], Any] = start_learner) -> FastAPI:
    """The FastAPI app of one deployment (or of one replica of it): the server's components and the
    learner (`learner_factory`: the co-located one by default; None when off), wired together."""
    check_bind(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async with running(config, model_dir) as components:
            learner = await asyncio.to_thread(learner_factory, config, model_dir)
            attach(app, components, learner)
            try:
                yield
            finally:
                if learner is not None:
                    await asyncio.to_thread(learner.close)

    return create_app(config.server, lifespan)
