"""API keys: who may call `/v1` (user keys) and `/admin` (admin keys).

Keys come from environment variables, sha256 digests in the config, or (development only) plain text
in the config. Keys are never stored: the store records `key_id`, a short digest of the key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from fastapi import Request

from liveloop.server.config import AuthConfig
from liveloop.server.errors import APIError


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Principal:
    key_id: str  # first 16 hex characters of sha256(key)
    admin: bool


class KeyRing:
    def __init__(self, config: AuthConfig, environ: dict[str, str] | None = None):
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
        return Principal(digest[:16], admin) if user else None


def _split(value: str) -> set[str]:
    return {k.strip() for k in value.split(",") if k.strip()}


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIError(401, "missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key")
    return key.strip()


def require_user(request: Request) -> Principal:
    principal = request.app.state.keys.resolve(_bearer(request))
    if principal is None:
        raise APIError(401, "incorrect API key provided", code="invalid_api_key")
    return principal


def require_admin(request: Request) -> Principal:
    principal = require_user(request)
    if not principal.admin:
        raise APIError(403, "this route needs an admin key", code="insufficient_permissions")
    return principal
