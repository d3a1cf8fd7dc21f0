"""The store's fleet part: what the replicas of one deployment share through the store. The deployment's
random id (it names the private namespace its shared memory lives in), the replica registry
(store/replicas.py), the leases that name the fleet's leader (store/lease.py) and the fleet-wide
limits' counts (store/fleet_counts.py)."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from liveloop.store.db import Database, Part
from liveloop.store.fleet_counts import FleetCounts
from liveloop.store.lease import Leases
from liveloop.store.models import Deployment, utcnow
from liveloop.store.replicas import ReplicaRegistry


class FleetQueries(Part):
    def __init__(self, db: Database):
        super().__init__(db)
        self.registry = ReplicaRegistry(db)
        self.leases = Leases(db)
        self.counts = FleetCounts(db)

    def deployment_id(self) -> str:
        """This deployment's random id (made by the migration that created the table; made here if a
        database lost it): it names the private namespace the deployment's shared memory lives in."""
        with self._session.begin() as s:
            row = s.scalars(select(Deployment).order_by(Deployment.created_at, Deployment.id)).first()
            if row is None:
                row = Deployment(id=uuid.uuid4().hex, created_at=utcnow())
                s.add(row)
            return row.id
