"""initial schema: policy_versions, responses, feedback, learner_cursor

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "policy_versions",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("parent", sa.Integer, sa.ForeignKey("policy_versions.version"), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("checkpoint_path", sa.Text, nullable=True),
        sa.Column("checkpoint_sha256", sa.String(64), nullable=True),
        sa.Column("learner_step", sa.Integer, nullable=False),
        sa.Column("samples_used", sa.Integer, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("api_key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("policy_version", sa.Integer, sa.ForeignKey("policy_versions.version"), nullable=False),
        sa.Column("endpoint", sa.String(16), nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
        sa.Column("response_ids", sa.LargeBinary, nullable=False),
        sa.Column("behavior_logprobs", sa.LargeBinary, nullable=False),
        sa.Column("action_mask", sa.LargeBinary, nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float, nullable=False),
        sa.Column("top_p", sa.Float, nullable=False),
        sa.Column("seed", sa.Integer, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("request_meta", sa.JSON, nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_responses_api_key_id", "responses", ["api_key_id"])
    op.create_index("ix_responses_policy_version", "responses", ["policy_version"])
    op.create_index("ix_responses_created_at", "responses", ["created_at"])
    op.create_table(
        "feedback",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.String(64), sa.ForeignKey("responses.id"), nullable=False),
        sa.Column("api_key_id", sa.String(32), nullable=False),
        sa.Column("reward", sa.SmallInteger, nullable=False),
        sa.Column("comment", sa.Text, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("response_id", "api_key_id", name="uq_feedback_response_key"),
        sa.CheckConstraint("reward IN (0, 1)", name="ck_feedback_reward"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_feedback_response_id", "feedback", ["response_id"])
    op.create_index("ix_feedback_created_at", "feedback", ["created_at"])
    op.create_table(
        "learner_cursor",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("last_feedback_id", sa.Integer, nullable=False),
        sa.Column("policy_version", sa.Integer, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("learner_cursor")
    op.drop_index("ix_feedback_created_at", "feedback")
    op.drop_index("ix_feedback_response_id", "feedback")
    op.drop_table("feedback")
    op.drop_index("ix_responses_created_at", "responses")
    op.drop_index("ix_responses_policy_version", "responses")
    op.drop_index("ix_responses_api_key_id", "responses")
    op.drop_table("responses")
    op.drop_table("policy_versions")
