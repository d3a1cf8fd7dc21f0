"""Every route takes its one handler (server/edge/dependencies.py), and none is served before the
composition root has attached them: a request that races the start gets 503 with Retry-After."""

from __future__ import annotations

import contextlib
import dataclasses

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from liveloop.server.config import ServerConfig
from liveloop.server.edge import dependencies
from liveloop.server.edge.app import create_app

# routes that read nothing of the server: the static statuses, the dashboard's sign-out and files, the API docs,
# Claude Code's reachability probe
WITHOUT_HANDLER = {"/admin/statuses", "/dashboard/logout", "/dashboard/static/{name}", "/openapi.json", "/docs", "/api/hello", "/"}


@contextlib.asynccontextmanager
async def _nothing(app):
    yield


def _getters() -> dict:
    """Each handler's dependency, by the `Handlers` field it returns."""
    return {getattr(dependencies, f.name): f.name for f in dataclasses.fields(dependencies.Handlers) if f.name != "keys"}


def test_every_route_takes_one_handler():
    getters = _getters()
    app = create_app(ServerConfig(), _nothing)
    taken: dict[str, list[str]] = {}
    for route in app.routes:
        if isinstance(route, APIRoute):
            taken[route.path + " " + ",".join(sorted(route.methods))] = [
                getters[d.call] for d in route.dependant.dependencies if d.call in getters
            ]
    wrong = {r: h for r, h in taken.items() if len(h) != (0 if r.split()[0] in WITHOUT_HANDLER else 1)}
    assert not wrong, wrong
    used = {h[0] for h in taken.values() if h}
    assert used == set(getters.values()), "a handler no route takes: " + ", ".join(sorted(set(getters.values()) - used))


def test_a_request_before_the_handlers_are_attached_is_a_503():
    app = create_app(ServerConfig(), _nothing)
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        got = client.get("/v1/models", headers={"authorization": "Bearer k"})
    assert got.status_code == 503 and got.headers["retry-after"] == "1"
    assert got.json()["error"]["code"] == "not_ready"
