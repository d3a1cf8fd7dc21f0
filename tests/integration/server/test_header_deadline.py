"""Half-sent requests cannot hold connections: uvicorn run with `uvicorn_options` (server/app.py) closes a
connection whose request headers are not complete within `[server] header_timeout_seconds` of its
opening or of its previous response (uvicorn's own h11 protocol keeps it for ever), while a normal
client is served throughout. A real uvicorn server on 127.0.0.1 with a trivial app: the guard is the
HTTP protocol's, not the app's."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from liveloop.devtools import free_port
from liveloop.server.app import uvicorn_options
from liveloop.server.config import ServerConfig

TIMEOUT = 1.0


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server():
    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, lifespan="off",
                            **uvicorn_options(ServerConfig(header_timeout_seconds=TIMEOUT, log_level="warning")))
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield f"http://127.0.0.1:{port}", port
    srv.should_exit = True
    thread.join(10)


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_half_sent_requests_are_closed_and_nobody_waits_for_them(server):
    base, port = server
    half = []
    for i in range(200):  # bounded: 200 connections that never finish their headers
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"")
        half.append(sock)
    started = time.monotonic()
    assert httpx.get(base + "/healthz", timeout=5).text == "ok"  # a normal client is served meanwhile
    closed = [_closed(sock, max(0.1, started + TIMEOUT + 5 - time.monotonic())) for sock in half]
    for sock in half:
        sock.close()
    assert all(closed), f"{closed.count(False)} of 200 half-sent connections still open"
    assert httpx.get(base + "/healthz", timeout=5).text == "ok"


def test_a_keep_alive_connection_that_starts_a_request_and_stalls_is_closed(server):
    _, port = server
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /b HTTP/1.1\r\nHost: x\r\n")  # the next request's headers, never finished
    assert _closed(sock, TIMEOUT + 5)
    sock.close()
