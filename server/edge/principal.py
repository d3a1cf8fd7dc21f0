"""Who a request is: `Principal` (a key's id, admin or not, stored or not) and the `KeyRing` of the
configured keys that resolves a key to one. A leaf: it imports nothing of the edge, so the pipeline and
the routes both take a `Principal` without loading authentication.

Keys come from environment variables, sha256 digests in the config, or (development only) plain text
in the config. Keys are never stored: the store records `key_id`, a short digest of the key."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Container
from dataclasses import dataclass

from liveloop.server.config import AuthConfig

KEY_ID_CHARS = 16  # a key's id: the first hex characters of its sha256


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_id(key: str) -> str:
    """The id the store records for `key` (what `Principal.key_id` holds)."""
    return key_digest(key)[:KEY_ID_CHARS]


@dataclass(frozen=True)
class Principal:
    key_id: str  # first 16 hex characters of sha256(key)
    admin: bool
    unstored: bool = False  # a forgotten key served under `forgotten_keys = "unstored"`: log nothing of it


class KeyRing:
    """The configured keys, and the forgotten ones (`forgotten`: the store's view, store/rights.py)."""

    def __init__(self, config: AuthConfig, environ: dict[str, str] | None = None, forgotten: Container[str] = frozenset()):
        self.forgotten = forgotten
        self.forgotten_policy = config.forgotten_keys
        env = os.environ if environ is None else environ
        users = set(config.dev_user_keys) | _split(env.get(config.user_keys_env, ""))
        admins = set(config.dev_admin_keys) | _split(env.get(config.admin_keys_env, ""))
        self._user = {key_digest(k) for k in users} | {h.lower() for h in config.user_key_sha256}
        self._admin = {key_digest(k) for k in admins} | {h.lower() for h in config.admin_key_sha256}
        if not self._user and not self._admin:
            raise ValueError(
                f"auth: no API keys configured (set {config.user_keys_env} / {config.admin_keys_env}, "
                "auth.user_key_sha256, or auth.dev_user_keys for development)"
            )

    def resolve(self, key: str) -> Principal | None:
        digest = key_digest(key)
        admin = any(hmac.compare_digest(digest, d) for d in self._admin)
        user = admin or any(hmac.compare_digest(digest, d) for d in self._user)
        return Principal(digest[:KEY_ID_CHARS], admin) if user else None


def _split(value: str) -> set[str]:
    return {k.strip() for k in value.split(",") if k.strip()}
