"""conversations: what a chat-shaped response was asked and answered, for the API's reads (stored
chat completions, the Responses API's `previous_response_id`) and the trainer-shape exports; the
constraint its tokens were sampled under (the learner replays it); n > 1 choices' group

- `messages`: the request's conversation (OpenAI chat messages: role, content, tool_calls,
  tool_call_id); for a Responses API turn only its own input items, the earlier turns being its
  `previous_response_id` chain
- `tools`: the tool definitions offered (OpenAI chat's shape); `output`: the reply as a message
  (content and tool_calls); `options`: what a read of it echoes (instructions, tool_choice, ...)
- `grammar`: the constraint (an xgrammar structural tag, liveloop.grammar) its tokens were sampled
  under; NULL: free sampling
- `previous_response_id` (indexed: a chain is walked one lookup a turn), `group_id` (indexed) and
  `choice_index`: the choices of one request with n > 1
- index (api_key_id, endpoint, created_at): a key's stored completions, a page at a time

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ("messages", "tools", "output", "options"):
        op.add_column("responses", sa.Column(name, sa.JSON(none_as_null=True), nullable=True))
    op.add_column("responses", sa.Column("grammar", sa.Text(), nullable=True))
    op.add_column("responses", sa.Column("previous_response_id", sa.String(64), nullable=True))
    op.add_column("responses", sa.Column("group_id", sa.String(64), nullable=True))
    op.add_column("responses", sa.Column("choice_index", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_responses_previous_response_id", "responses", ["previous_response_id"])
    op.create_index("ix_responses_group_id", "responses", ["group_id"])
    op.create_index("ix_responses_key_endpoint_created", "responses", ["api_key_id", "endpoint", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_key_endpoint_created", "responses")
    op.drop_index("ix_responses_group_id", "responses")
    op.drop_index("ix_responses_previous_response_id", "responses")
    for column in ("choice_index", "group_id", "previous_response_id", "grammar", "options", "output", "tools", "messages"):
        op.drop_column("responses", column)
