"""The Host header allow-list (`[server] allowed_hosts`), against DNS rebinding: a web page on
attacker.example whose name is made to resolve to 127.0.0.1 sends its requests to this server with
`Host: attacker.example`; those are refused before any route runs (400, an OpenAI-style error).

Starlette's TrustedHostMiddleware is not used: it drops the port before comparing (so it cannot hold
a name to the port it is served on), splits `[::1]:8000` at its first colon, and answers in plain text.

An entry is `name` (any port, or none), `name:port`, `[v6-address]` / `[v6-address]:port`, `*.domain`
(that domain's subdomains, any port) or `*` (every Host: the check is off). Names compare without case.
"""

from __future__ import annotations

import json
from typing import Any

from liveloop.server.config import ServerConfig
from liveloop.server.edge.errors import error_body

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` or `[v6]:port` -> (lowercased name, port or None); None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port = value.partition(":")
        port = port if sep else None
    if not name or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
        return None
    return name, None if port is None else int(port)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(config: ServerConfig) -> tuple[str, ...]:
    """The configured entries, or the default: loopback's names and the configured host, on its port."""
    if config.allowed_hosts:
        return config.allowed_hosts
    names = dict.fromkeys((*LOOPBACK_NAMES, _bracketed(config.host.lower())))
    return tuple(f"{name}:{config.port}" for name in names)


class HostAllowList:
    """Pure ASGI middleware: an HTTP request whose Host header no entry allows gets 400."""

    def __init__(self, app: Any, entries: tuple[str, ...]):
        self.app = app
        self.any = "*" in entries
        self.exact: set[tuple[str, int | None]] = set()
        self.suffixes: list[str] = []
        for entry in entries:
            if entry.startswith("*.") and len(entry) > 2:
                self.suffixes.append(entry[1:].lower())
            elif entry != "*":
                parsed = split_host(entry)
                if parsed is None:
                    raise ValueError(f"server.allowed_hosts: {entry!r} is not `name`, `name:port`, `*.domain` or `*`")
                self.exact.add(parsed)

    def allows(self, host: str) -> bool:
        if self.any:
            return True
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = parsed
        return (name, port) in self.exact or (name, None) in self.exact or any(name.endswith(s) for s in self.suffixes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.any:
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        if self.allows(host):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body(400, f"this server does not answer to Host `{host[:100]}` (server.allowed_hosts)",
                                     param="host", code="invalid_host")).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
