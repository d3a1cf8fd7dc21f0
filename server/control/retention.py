"""`[store] retain_days`: responses and ratings older than it are deleted, periodically, by the fleet's
leader alone (`leader()`, server/control/leader.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from liveloop.store import Store

log = logging.getLogger(__name__)


async def apply_retention(store: Store, retain_days: float, interval: float, leader: Callable[[], bool] = lambda: True) -> None:
    """Delete responses and ratings older than `retain_days`, every `interval` seconds while this replica
    leads (`leader`), until cancelled."""
    while True:
        try:
            if not leader():
                await asyncio.sleep(interval)
                continue
            cutoff = datetime.now(timezone.utc) - timedelta(days=retain_days)
            deleted = await asyncio.to_thread(store.rights.delete_before, cutoff)
            if deleted.responses:
                log.info("retention: deleted %d responses and %d ratings older than %s", deleted.responses, deleted.ratings, cutoff)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retention")
        await asyncio.sleep(interval)
