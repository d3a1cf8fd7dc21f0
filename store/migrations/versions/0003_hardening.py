"""hardening: 64-bit seeds, ratings revised in place, per-key state (quarantine, forget), pinned
and pruned checkpoints

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # SQLite's INTEGER already holds 64 bits; PostgreSQL's does not.
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("responses", "seed", type_=sa.BigInteger, existing_nullable=True)
    op.add_column("feedback", sa.Column("revisions", sa.Integer, nullable=False, server_default="0"))
    op.add_column("feedback", sa.Column("updated_at", TS, nullable=True))
    op.create_index("ix_feedback_api_key_id", "feedback", ["api_key_id"])
    op.add_column("policy_versions", sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("policy_versions", sa.Column("pruned_at", TS, nullable=True))
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("quarantined", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("forgotten_at", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_column("policy_versions", "pruned_at")
    op.drop_column("policy_versions", "pinned")
    op.drop_index("ix_feedback_api_key_id", "feedback")
    op.drop_column("feedback", "updated_at")
    op.drop_column("feedback", "revisions")
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("responses", "seed", type_=sa.Integer, existing_nullable=True)
