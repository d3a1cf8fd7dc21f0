"""the release gate: each candidate's evaluation (the suite's checks against the live and the base
version, whether it passed, what it cost), stored per version (store/release.py). The gate's
statuses ("canary", "held") need no schema change: policy_versions.status is VARCHAR(16).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version", sa.Integer, sa.ForeignKey("policy_versions.version"), nullable=False),
        sa.Column("live_version", sa.Integer, nullable=True),
        sa.Column("passed", sa.Boolean, nullable=False),
        sa.Column("checks", sa.JSON, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("engine_seconds", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_evaluations_version", "evaluations", ["version"])


def downgrade() -> None:
    op.drop_index("ix_evaluations_version", table_name="evaluations")
    op.drop_table("evaluations")
