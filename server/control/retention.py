"""`[store] retain_days`: responses and ratings older than it are deleted, periodically, by the fleet's
leader alone (`leader()`: the leader lease's term this replica holds, None when another leads;
server/control/leader.py), each deletion fenced with that term (a deposed leader deletes nothing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from liveloop.store.lease import StaleLeader
from liveloop.store.rights import RightsQueries

log = logging.getLogger(__name__)


async def apply_retention(rights: RightsQueries, retain_days: float, interval: float, leader: Callable[[], int | None] = lambda: 0) -> None:
    """Delete responses and ratings older than `retain_days`, every `interval` seconds while this replica
    leads (`leader`: its term; 0, a lone server without a lease, is not fenced), until cancelled."""
    while True:
        try:
            term = leader()
            if term is None:
                await asyncio.sleep(interval)
                continue
            cutoff = datetime.now(timezone.utc) - timedelta(days=retain_days)
            deleted = await asyncio.to_thread(rights.delete_before, cutoff, 1000, term or None)
            if deleted.responses:
                log.info("retention: deleted %d responses and %d ratings older than %s", deleted.responses, deleted.ratings, cutoff)
        except asyncio.CancelledError:
            raise
        except StaleLeader as exc:
            log.warning("retention: %s", exc)
        except Exception:
            log.exception("retention")
        await asyncio.sleep(interval)
