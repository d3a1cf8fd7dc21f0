"""What the routes are handed. The composition root (liveloop/app.py) builds the server's parts once and
attaches them to the app in one place (`attach`); a route names the parts it uses as a FastAPI
dependency (`parts: Parts = Depends(parts)`, or a handler object such as `Depends(chat)`), never
`request.app.state`. Until the lifespan has attached them (a request that raced the start) the
dependency answers 503 with Retry-After, never a 500.

The edge's own state (dashboard sessions, the responses being generated) lives
here too: built with the app from `[server]`, it is the edge's, not a component's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI, Request

from liveloop.server.edge.errors import APIError

if TYPE_CHECKING:
    from liveloop.metrics import Metrics
    from liveloop.server.control.forgetting import Forgetting
    from liveloop.server.control.gate import ReleaseGate
    from liveloop.server.control.leader import Leadership
    from liveloop.server.control.operations import Operations
    from liveloop.server.control.activator import Activator
    from liveloop.server.edge.pipeline.readiness import WarmUp
    from liveloop.server.edge.auth import KeyRing, LoginThrottle, Sessions
    from liveloop.server.edge.chat.serving import ServingChat
    from liveloop.server.edge.completions.serving import ServingCompletions
    from liveloop.server.edge.messages.serving import ServingMessages
    from liveloop.server.edge.pipeline.serving import Serving
    from liveloop.server.edge.pipeline.streaming import Generating
    from liveloop.server.edge.responses.serving import ServingResponses
    from liveloop.server.engines.base import Engine
    from liveloop.store import BatchWriter, Store
    from liveloop.store.replicas import ReplicaRegistry


class LearnerView(Protocol):
    """The co-located learner as the edge sees it (liveloop/app.py's, or a fleet replica's view of the
    one learner): its health for /healthz and its status for /admin/learner."""

    def health(self) -> Any: ...

    def status(self) -> dict: ...


@dataclass(frozen=True)
class EdgeState:
    """The edge's own state, made with the app (`create_app`) from `[server]`."""

    sessions: Sessions
    generating: Generating
    ops_open_on_loopback: bool


@dataclass(frozen=True)
class Parts:
    """The server's parts the routes use, typed: built by the composition root, attached once."""

    store: Store
    writer: BatchWriter
    engine: Engine
    tokenizer: Any
    metrics: Metrics
    keys: KeyRing
    login_throttle: LoginThrottle
    serving: Serving
    activator: Activator
    operations: Operations
    forgetting: Forgetting  # the server's one: one forget at a time moves learner cursors
    registry: ReplicaRegistry
    replica_id: str
    down_after_seconds: float
    edge: EdgeState
    learner: LearnerView | None = None
    gate: ReleaseGate | None = None
    leadership: Leadership | None = None
    started_at: int = 0
    handlers: Handlers | None = field(default=None, compare=False)
    warm_up: WarmUp | None = None  # the start's warm-up generation (server/edge/pipeline/readiness.py)


@dataclass(frozen=True)
class Handlers:
    """One handler object per generating endpoint family, built once (liveloop/app.py)."""

    chat: ServingChat
    completions: ServingCompletions
    messages: ServingMessages
    responses: ServingResponses


def attach(app: FastAPI, built: Parts) -> None:
    """The one place the parts meet the app (the lifespan calls it before the first request)."""
    app.state.parts = built


def detach(app: FastAPI) -> None:
    app.state.parts = None


def edge_state(app: FastAPI) -> EdgeState:
    return app.state.edge


def parts(request: Request) -> Parts:
    built = getattr(request.app.state, "parts", None)
    if built is None:
        raise APIError(503, "the server is starting or stopping", code="not_ready", retry_after=1)
    return built


def keyring(request: Request) -> KeyRing:
    """The API keys (what every authenticated route depends on first)."""
    return parts(request).keys


def edge(request: Request) -> EdgeState:
    """The edge's own state: there from the app's creation, before and after the parts."""
    return request.app.state.edge


def handlers(request: Request) -> Handlers:
    built = parts(request).handlers
    assert built is not None, "the composition root builds the handlers with the parts"
    return built
