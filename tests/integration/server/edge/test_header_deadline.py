"""Half-sent requests cannot hold connections, and idle keep-alive connections outlive the clients'
pools: uvicorn run with `uvicorn_options` (server/edge/app.py) closes a connection whose request headers are
not complete within `[server] header_timeout_seconds` of its opening or of a later request's first byte
(uvicorn's own protocols keep it for ever), while a normal client is served throughout; headers too large
get a 400 and a close (httptools bounds none itself); an idle
connection between requests stays open for `[server] keep_alive_seconds`, longer than httpx's (and so
the openai and anthropic clients') pool expiry, so the client always drops it first and never sends a
request into a connection the server is closing. A real uvicorn server on 127.0.0.1 with a trivial
app: the guard is the HTTP protocol's, not the app's."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from liveloop.devtools import free_port, serve_in_thread
from liveloop.server.edge.app import uvicorn_options
from liveloop.server.config import ServerConfig

TIMEOUT = 1.0


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server(request):
    port = free_port()
    keep_alive = getattr(request, "param", ServerConfig().keep_alive_seconds)
    options = uvicorn_options(ServerConfig(header_timeout_seconds=TIMEOUT, keep_alive_seconds=keep_alive, log_level="warning"))
    srv, thread = serve_in_thread(_app, port, timeout=30, lifespan="off", **options)
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


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock.recv(1024)


def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(server):
    """The race this closes: with the server's idle limit equal to the client's pool expiry (uvicorn's and
    httpx's defaults are both 5 s), a request sent on a pooled connection as the server times it out is
    dropped (httpx.ReadError on a POST, which nobody retries)."""
    _, port = server
    client_expiry = httpx.Limits().keepalive_expiry
    assert ServerConfig().keep_alive_seconds > 2 * client_expiry
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert _get(sock, "/a").startswith(b"HTTP/1.1 200")
    time.sleep(client_expiry + 1)  # idle past the moment an httpx pool would have dropped it
    assert _get(sock, "/b").startswith(b"HTTP/1.1 200")  # still the server's: served, not closed
    sock.close()


@pytest.mark.parametrize("server", [1.0], indirect=True)
def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_seconds(server):
    _, port = server
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert _get(sock, "/a").startswith(b"HTTP/1.1 200")
    assert _closed(sock, 1.0 + 5)
    sock.close()


def test_a_request_head_too_large_gets_a_400_and_a_close_and_a_normal_one_is_served(server):
    """h11 held a request's line and headers to 16 KiB; llhttp bounds nothing, so the protocol counts."""
    from liveloop.server.edge.app import MAX_HEADER_BYTES

    base, port = server
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nx-big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n")
    assert sock.recv(1024).startswith(b"HTTP/1.1 400")
    assert _closed(sock, 5)
    sock.close()
    assert httpx.get(base + "/a", headers={"x-fine": "a" * (MAX_HEADER_BYTES // 2)}, timeout=5).text == "ok"
