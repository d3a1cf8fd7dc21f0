"""The Host allow-list's entries and matching (server/edge/hosts.py): names with and without ports, IPv6 in
brackets, subdomain wildcards, `*`, and the default derived from `[server] host` and `port`; a bad
entry or policy fails at config load, naming the key."""

import pytest

from liveloop.server.config import AuthConfig, ServerConfig
from liveloop.server.edge.hosts import HostAllowList, allowed_hosts, split_host


def _allows(entries: tuple[str, ...], host: str) -> bool:
    return HostAllowList(None, entries).allows(host)


def test_split_host():
    assert split_host("Example.COM:8000") == ("example.com", 8000)
    assert split_host("[::1]:8000") == ("[::1]", 8000) and split_host("[::1]") == ("[::1]", None)
    assert split_host("localhost") == ("localhost", None)
    for bad in ("", ":80", "host:", "host:x", "host:70000", "[::1", "[::1]x"):
        assert split_host(bad) is None, bad


def test_the_default_is_loopback_and_the_configured_host_on_its_port():
    entries = allowed_hosts(ServerConfig(host="10.1.2.3", port=8123))
    assert entries == ("127.0.0.1:8123", "localhost:8123", "[::1]:8123", "10.1.2.3:8123")
    assert _allows(entries, "LOCALHOST:8123") and _allows(entries, "[::1]:8123") and _allows(entries, "10.1.2.3:8123")
    # a rebound name, another port, no port (port 80), nothing at all
    for refused in ("attacker.example:8123", "127.0.0.1:8124", "127.0.0.1", ""):
        assert not _allows(entries, refused), refused
    assert allowed_hosts(ServerConfig(host="::1", port=9)) == ("127.0.0.1:9", "localhost:9", "[::1]:9")


def test_configured_entries():
    entries = ("llm.example.com", "api.example.com:443", "*.internal.example", "[2001:db8::1]")
    for ok in ("llm.example.com", "llm.example.com:8443", "api.example.com:443", "a.internal.example:1", "[2001:db8::1]:8000"):
        assert _allows(entries, ok), ok
    for refused in ("api.example.com", "api.example.com:80", "internal.example", "evil-llm.example.com", "x.example.com"):
        assert not _allows(entries, refused), refused
    assert _allows(("*",), "anything:1")


def test_bad_entries_and_policies_fail_at_load():
    with pytest.raises(ValueError, match="allowed_hosts"):
        ServerConfig(allowed_hosts=("http://x.example",))
    with pytest.raises(ValueError, match="forgotten_keys"):
        AuthConfig(forgotten_keys="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allowed_hosts"):
        HostAllowList(None, ("host:99999",))
