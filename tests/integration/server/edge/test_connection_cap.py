"""A client cannot hold the server's every descriptor: a real uvicorn server run with `uvicorn_options`
(server/edge/app.py) and `[server] max_connections = 3` answers a request 503 while three idle sockets
hold it, and 200 again once they are gone; 0 is no cap."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from liveloop.devtools import free_port, serve_in_thread
from liveloop.server.config import ServerConfig
from liveloop.server.edge.app import uvicorn_options


async def _ok(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def serve():
    running = []

    def start(config: ServerConfig) -> int:
        port = free_port()
        running.append(serve_in_thread(_ok, port, timeout=30, lifespan="off", **uvicorn_options(config)))
        return port

    yield start
    for srv, thread in running:
        srv.should_exit = True
        thread.join(10)


def _idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def _status_until(port: int, want: int) -> int:
    """The status a fresh request gets, asked until it is `want` (the server takes in new sockets and
    notices closed ones on its own loop's turns) or 30 s have passed."""
    deadline = time.monotonic() + 30
    while True:
        status = httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code
        if status == want or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_past_the_cap_a_request_is_503_and_below_it_200(serve):
    port = serve(ServerConfig(log_level="warning", max_connections=3, header_timeout_seconds=60))
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
    held = _idle(port, 3)
    try:
        assert _status_until(port, 503) == 503
    finally:
        for s in held:
            s.close()
    assert _status_until(port, 200) == 200


def test_zero_is_no_cap(serve):
    port = serve(ServerConfig(log_level="warning", max_connections=0, header_timeout_seconds=60))
    held = _idle(port, 20)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
    finally:
        for s in held:
            s.close()


def test_a_negative_cap_is_refused():
    with pytest.raises(ValueError, match="max_connections"):
        ServerConfig(max_connections=-1)
