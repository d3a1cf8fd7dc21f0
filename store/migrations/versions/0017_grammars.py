"""grammars: a constraint (an xgrammar structural tag) stored once per API key, however many responses
were sampled under it (the `n` choices of one request, every turn of an agent that forces the same
call); `responses.grammar_digest` names it (its sha256). A key's grammar row goes when its last
response under it does (store/rights.py), or with the key (forgetting). Rows from before this revision
keep their text in `responses.grammar`.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "grammars",
        sa.Column("api_key_id", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),  # sha256 of the text, hex
        sa.Column("text", sa.Text(), nullable=False),
    )
    op.add_column("responses", sa.Column("grammar_digest", sa.String(64), nullable=True))
    op.create_index("ix_responses_key_grammar", "responses", ["api_key_id", "grammar_digest"])


def downgrade() -> None:
    op.drop_index("ix_responses_key_grammar", "responses")
    op.drop_column("responses", "grammar_digest")
    op.drop_table("grammars")
