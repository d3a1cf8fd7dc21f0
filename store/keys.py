"""The store's per-API-key queries (quarantine, the ratings a disagreement score reads). Mixed into `Store`."""

from __future__ import annotations

from typing import Any


class KeyQueries:
    _session: Any
