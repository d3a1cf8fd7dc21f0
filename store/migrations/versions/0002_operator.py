"""operator state: learner_control (pause), operator_events (pause, resume, rollback, alarms)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "learner_control",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "operator_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_operator_events_created_at", "operator_events", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_operator_events_created_at", "operator_events")
    op.drop_table("operator_events")
    op.drop_table("learner_control")
