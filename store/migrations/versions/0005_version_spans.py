"""version spans: which policy version sampled which tokens of a response ((start, end, version)
triples over its token indexes, as JSON); NULL: all of it by the response's policy_version

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-15
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("version_spans", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("responses", "version_spans")
