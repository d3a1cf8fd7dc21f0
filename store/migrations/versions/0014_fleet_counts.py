"""fleet_counts: what each replica admitted per (bucket, subject) and window, and the levels it holds,
shared so that per-key rates, the per-key generation cap and the sign-in throttle hold fleet-wide
(store/fleet_counts.py, server/edge/fleet_limits.py)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_counts",
        sa.Column("replica", sa.String(160), primary_key=True),
        sa.Column("bucket", sa.String(32), primary_key=True),
        sa.Column("subject", sa.String(64), primary_key=True),
        sa.Column("window_start", sa.BigInteger, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_fleet_counts_window_start", "fleet_counts", ["window_start"])


def downgrade() -> None:
    op.drop_index("ix_fleet_counts_window_start", "fleet_counts")
    op.drop_table("fleet_counts")
