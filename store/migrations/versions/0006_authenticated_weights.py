"""authenticated weights: each version row names its weights' nonce and digest (what a receiver checks
the bytes it maps against before anything serves), and the deployment's random id (the private
namespace its shared memory lives in), generated once here

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-20
"""

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("policy_versions", sa.Column("weights_nonce", sa.String(32), nullable=True))
    op.add_column("policy_versions", sa.Column("weights_digest", sa.String(64), nullable=True))
    deployment = op.create_table(
        "deployment",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    # random, never derived from the URL: two checkouts on one relative SQLite URL get two ids
    op.bulk_insert(deployment, [{"id": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("deployment")
    op.drop_column("policy_versions", "weights_digest")
    op.drop_column("policy_versions", "weights_nonce")
