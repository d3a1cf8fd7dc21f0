"""adapters: the segment a policy version belongs to (NULL: the base weights; a name: that segment's
LoRA adapter) and the segment that served each response

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("policy_versions", sa.Column("segment", sa.String(64), nullable=True))
    op.create_index("ix_policy_versions_segment", "policy_versions", ["segment"])
    op.add_column("responses", sa.Column("segment", sa.String(64), nullable=True))
    op.create_index("ix_responses_segment", "responses", ["segment"])


def downgrade() -> None:
    op.drop_index("ix_responses_segment", "responses")
    op.drop_column("responses", "segment")
    op.drop_index("ix_policy_versions_segment", "policy_versions")
    op.drop_column("policy_versions", "segment")
