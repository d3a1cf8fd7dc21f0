"""Who a client is: a real uvicorn server run with `uvicorn_options` (server/edge/app.py) takes the
socket's address, not an X-Forwarded-For header a loopback client sets itself (uvicorn believes one from
127.0.0.1 by default, so a local client could pose as any address to the per-address sign-in throttle);
`[server] trusted_proxies` names the proxies whose header is believed. And `check_bind`'s loopback test
is an address test, not a string prefix (`127.example.com` is a name anyone's DNS can point anywhere)."""

from __future__ import annotations


import httpx
import pytest

from liveloop.config import load_config
from liveloop.devtools import free_port, serve_in_thread
from liveloop.server.config import ServerConfig
from liveloop.server.edge.app import UnsafeBind, check_bind, is_loopback, uvicorn_options


async def _whoami(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["client"][0].encode()})


def _client_seen(server: ServerConfig) -> str:
    port = free_port()
    srv, thread = serve_in_thread(_whoami, port, timeout=30, lifespan="off", **uvicorn_options(server))
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=30).text
    finally:
        srv.should_exit = True
        thread.join(10)


def test_a_forwarded_for_header_is_not_believed_unless_its_proxy_is_trusted():
    assert _client_seen(ServerConfig(log_level="warning")) == "127.0.0.1"
    assert _client_seen(ServerConfig(log_level="warning", trusted_proxies=("127.0.0.1",))) == "203.0.113.9"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("127.example.com", False), ("0.0.0.0", False), ("10.0.0.1", False), ("example.com", False),
])
def test_loopback_is_an_address_not_a_prefix(host, loopback):
    assert is_loopback(host) is loopback


def test_the_development_keys_are_refused_on_a_name_that_only_looks_loopback():
    config = load_config("tiny").with_section("server", host="127.example.com")
    if not (config.auth.dev_user_keys or config.auth.dev_admin_keys):
        config = config.with_section("auth", dev_user_keys=("sk-dev",))
    with pytest.raises(UnsafeBind):
        check_bind(config)
    check_bind(config.with_section("server", host="127.0.0.1"))  # the same keys on loopback: allowed
