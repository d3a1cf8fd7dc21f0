"""the replica registry: every serving process (a Ray Serve replica, or the one process of a plain
`liveloop serve`) heartbeats its row: what it serves, its load and its health (store/replicas.py)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica_id", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("serving_version", sa.Integer, nullable=True),
        sa.Column("adapter_versions", sa.JSON, nullable=False),
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("healthy", sa.Boolean, nullable=False),
    )
    op.create_index("ix_replicas_heartbeat_at", "replicas", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index("ix_replicas_heartbeat_at", table_name="replicas")
    op.drop_table("replicas")
