"""What the routes are handed: one handler per endpoint family, each built by the composition root
(liveloop/app.py) with exactly its collaborators and attached to the app in one place (`attach`). A
route takes its one handler as a FastAPI dependency (`h: ServingChat = Depends(chat)`), never
`request.app.state`. Until the lifespan has attached them (a request that raced the start) the
dependency answers 503 with Retry-After, never a 500.

The edge's own state (dashboard sessions, the responses being generated) lives here too: built with
the app from `[server]`, it is the edge's, not a component's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI, Request

from liveloop.server.edge.errors import APIError

if TYPE_CHECKING:
    from liveloop.server.edge.admin.alarms import AdminAlarms
    from liveloop.server.edge.admin.dashboard import Dashboard
    from liveloop.server.edge.admin.episodes import AdminEpisodes
    from liveloop.server.edge.admin.fleet import AdminFleet
    from liveloop.server.edge.admin.keys import AdminKeys
    from liveloop.server.edge.admin.learning import AdminLearning
    from liveloop.server.edge.admin.release import AdminRelease
    from liveloop.server.edge.admin.versions import AdminVersions
    from liveloop.server.edge.auth import Sessions
    from liveloop.server.edge.chat.serving import ServingChat
    from liveloop.server.edge.chat.stored import StoredChats
    from liveloop.server.edge.completions.serving import ServingCompletions
    from liveloop.server.edge.feedback.serving import ServingFeedback
    from liveloop.server.edge.messages.serving import ServingMessages
    from liveloop.server.edge.models.serving import ServingModels
    from liveloop.server.edge.ops.serving import Ops
    from liveloop.server.edge.pipeline.streaming import Generating
    from liveloop.server.edge.principal import KeyRing
    from liveloop.server.edge.responses.serving import ServingResponses
    from liveloop.server.edge.responses.stored import StoredResponses
    from liveloop.server.edge.tokens.serving import ServingTokens
    from liveloop.server.edge.versions.serving import ServingVersions


class LearnerView(Protocol):
    """The co-located learner as the edge sees it (liveloop/app.py's, or a fleet replica's view of the
    one learner): its health for /healthz and its status for /admin/learner."""

    def health(self) -> Any: ...

    def status(self) -> Any: ...


@dataclass(frozen=True)
class EdgeState:
    """The edge's own state, made with the app (`create_app`) from `[server]`."""

    sessions: Sessions
    generating: Generating
    ops_open_on_loopback: bool


@dataclass(frozen=True)
class Handlers:
    """One handler per endpoint family (and the API keys every authenticated route checks first), built
    once by the composition root."""

    keys: KeyRing
    chat: ServingChat
    stored_chats: StoredChats
    completions: ServingCompletions
    messages: ServingMessages
    responses: ServingResponses
    stored_responses: StoredResponses
    tokens: ServingTokens
    feedback: ServingFeedback
    versions: ServingVersions
    models: ServingModels
    ops: Ops
    admin_versions: AdminVersions
    admin_release: AdminRelease
    admin_learning: AdminLearning
    admin_alarms: AdminAlarms
    admin_keys: AdminKeys
    admin_fleet: AdminFleet
    admin_episodes: AdminEpisodes
    dashboard: Dashboard


def attach(app: FastAPI, built: Handlers, replica_id: str) -> None:
    """The one place the handlers meet the app (the lifespan calls it before the first request);
    `replica_id` names this replica in every response (server/edge/app.py `ReplicaHeader`)."""
    app.state.handlers = built
    app.state.replica_id = replica_id


def detach(app: FastAPI) -> None:
    app.state.handlers = None
    app.state.replica_id = None


def edge_state(app: FastAPI) -> EdgeState:
    return app.state.edge


def edge(request: Request) -> EdgeState:
    """The edge's own state: there from the app's creation, before and after the handlers."""
    return request.app.state.edge


def handlers(request: Request) -> Handlers:
    built = getattr(request.app.state, "handlers", None)
    if built is None:
        raise APIError(503, "the server is starting or stopping", code="not_ready", retry_after=1)
    return built


def keyring(request: Request) -> KeyRing:
    """The API keys (what every authenticated route depends on first)."""
    return handlers(request).keys


# -- one dependency per handler: what a route names in `Depends(...)` -------------------------------
def chat(request: Request) -> ServingChat:
    return handlers(request).chat


def stored_chats(request: Request) -> StoredChats:
    return handlers(request).stored_chats


def completions(request: Request) -> ServingCompletions:
    return handlers(request).completions


def messages(request: Request) -> ServingMessages:
    return handlers(request).messages


def responses(request: Request) -> ServingResponses:
    return handlers(request).responses


def stored_responses(request: Request) -> StoredResponses:
    return handlers(request).stored_responses


def tokens(request: Request) -> ServingTokens:
    return handlers(request).tokens


def feedback(request: Request) -> ServingFeedback:
    return handlers(request).feedback


def versions(request: Request) -> ServingVersions:
    return handlers(request).versions


def models(request: Request) -> ServingModels:
    return handlers(request).models


def ops(request: Request) -> Ops:
    return handlers(request).ops


def admin_versions(request: Request) -> AdminVersions:
    return handlers(request).admin_versions


def admin_release(request: Request) -> AdminRelease:
    return handlers(request).admin_release


def admin_learning(request: Request) -> AdminLearning:
    return handlers(request).admin_learning


def admin_alarms(request: Request) -> AdminAlarms:
    return handlers(request).admin_alarms


def admin_keys(request: Request) -> AdminKeys:
    return handlers(request).admin_keys


def admin_fleet(request: Request) -> AdminFleet:
    return handlers(request).admin_fleet


def admin_episodes(request: Request) -> AdminEpisodes:
    return handlers(request).admin_episodes


def dashboard(request: Request) -> Dashboard:
    return handlers(request).dashboard
