"""episodes: the turns of an agent's trajectory linked into one rollout (docs/design.md, "Episodes")

- `parent_id`: the turn this response continues (NULL: the episode's first turn); indexed, so the
  turns after one are an index lookup (a deletion takes them along)
- `root_id`: the episode's first turn (a first turn: its own id); indexed, one read gets an episode
- `turn`: 0 for the first turn, the parent's + 1 after
- `prefix_tokens`: how many of this turn's prompt tokens are the parent's prompt and sampled tokens,
  exactly (NULL: the prompt does not carry them token for token, so the learner starts the trajectory
  here); the tokens between them and this turn's own are the observations
- `linked_by`: what linked it: `previous_response` (the Responses API), `prefix` (the resent
  conversation), `episode_id` (the request's metadata said so)
- `link_hash`: the hash of its prompt and sampled tokens (store/linking.py); index (api_key_id,
  link_hash): a resent conversation finds its parent with one indexed lookup per batch, never a scan
- `text_hash`: the hash of its prompt's text and its sampled tokens' text; index (api_key_id, text_hash):
  the server finds the turn a resent conversation's text carries and reuses its tokens
  (server/edge/pipeline/splicing.py), so the next prompt carries the sampled tokens themselves, not a re-tokenization
- `episode_tag`: a digest of the request's `metadata.episode_id`; index (api_key_id, episode_tag)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("parent_id", sa.String(64), nullable=True))
    op.add_column("responses", sa.Column("root_id", sa.String(64), nullable=True))
    op.add_column("responses", sa.Column("turn", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("responses", sa.Column("prefix_tokens", sa.Integer(), nullable=True))
    op.add_column("responses", sa.Column("linked_by", sa.String(24), nullable=True))
    op.add_column("responses", sa.Column("link_hash", sa.BigInteger(), nullable=True))
    op.add_column("responses", sa.Column("text_hash", sa.BigInteger(), nullable=True))
    op.add_column("responses", sa.Column("episode_tag", sa.String(64), nullable=True))
    op.create_index("ix_responses_parent_id", "responses", ["parent_id"])
    op.create_index("ix_responses_root_id", "responses", ["root_id"])
    op.create_index("ix_responses_key_link_hash", "responses", ["api_key_id", "link_hash"])
    op.create_index("ix_responses_key_text_hash", "responses", ["api_key_id", "text_hash"])
    op.create_index("ix_responses_key_episode_tag", "responses", ["api_key_id", "episode_tag"])


def downgrade() -> None:
    for name in ("ix_responses_key_episode_tag", "ix_responses_key_text_hash", "ix_responses_key_link_hash", "ix_responses_root_id", "ix_responses_parent_id"):
        op.drop_index(name, "responses")
    for column in ("episode_tag", "text_hash", "link_hash", "linked_by", "prefix_tokens", "turn", "root_id", "parent_id"):
        op.drop_column("responses", column)
