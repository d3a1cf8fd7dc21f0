"""leases: one named row per control duty, held by one process until its expiry (store/lease.py); the
fleet's control loops (release gate decisions and evaluations, alarms, guard, retention) run in the
holder of the "leader" lease (server/control/leader.py)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("term", sa.Integer, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
