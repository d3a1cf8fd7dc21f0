"""sampling: how a response's tokens were drawn, as its behaviour logprobs describe them
(liveloop/sampling.py `Sampling`: temperature, top_p, top_k, min_p, repetition_penalty, min_tokens, and
whether the logprobs are of the draw's shaped distribution, "sampled", or of the raw one, "raw").
NULL: a response stored before this revision, whose logprobs are of the raw temperature-1 distribution
whatever it was drawn at (the learner trains it only when that was its draw's distribution too).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("sampling", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("responses", "sampling")
