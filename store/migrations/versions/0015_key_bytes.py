"""key_bytes: how many bytes of responses each API key had stored per UTC day (store/keys.py), the
count its daily storage budget is checked against (`[server] stored_mb_per_day`)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_bytes",
        sa.Column("api_key_id", sa.String(32), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True),  # UTC days since 1970-01-01
        sa.Column("bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("key_bytes")
