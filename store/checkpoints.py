"""The store's checkpoint-retention queries (pinning, pruning). Mixed into `Store`."""

from __future__ import annotations

from typing import Any


class CheckpointQueries:
    _session: Any
