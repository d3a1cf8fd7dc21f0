"""data rights, complete: tombstones of deleted responses (the key that received a response deleted it,
perhaps while it was still being generated), which the writer checks in the inserting transaction

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deleted_responses",
        sa.Column("response_id", sa.String(64), primary_key=True),
        sa.Column("api_key_id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_deleted_responses_created_at", "deleted_responses", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_deleted_responses_created_at", table_name="deleted_responses")
    op.drop_table("deleted_responses")
