"""feedback ids in commit order with many writers: on PostgreSQL a rating's id comes from a one-row
counter (`feedback_counter`), taken with `UPDATE ... SET last_id = last_id + n RETURNING last_id` in the
inserting transaction; the counter's row lock is held to commit, so a smaller id never commits after a
larger one and a learner's cursor (`learner_cursor.last_feedback_id`) never passes a rating still on its
way. The column default goes through the same counter (`feedback_next_id()`), so nothing inserts
around it, and the serial sequence is dropped. Existing rows keep their ids; the counter starts past
the largest id ever handed out (the sequence's, which counts deleted rows too), so no id is reused.

SQLite is unchanged: it has one writer at a time (the write lock is held from the insert to commit),
so its AUTOINCREMENT ids are already commit order.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

NEXT_ID = """
CREATE FUNCTION feedback_next_id() RETURNS integer LANGUAGE sql VOLATILE AS $$
    UPDATE feedback_counter SET last_id = last_id + 1 WHERE id = 1 RETURNING last_id
$$
"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.create_table(
        "feedback_counter",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("last_id", sa.Integer, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_feedback_counter_one_row"),
    )
    last = bind.execute(sa.text("SELECT coalesce(max(id), 0) FROM feedback")).scalar_one()
    sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence('feedback', 'id')")).scalar()
    if sequence is not None:
        handed, called = bind.execute(sa.text(f"SELECT last_value, is_called FROM {sequence}")).one()
        last = max(last, handed if called else handed - 1)
    bind.execute(sa.text("INSERT INTO feedback_counter (id, last_id) VALUES (1, :last)"), {"last": last})
    op.execute(NEXT_ID)
    op.execute("ALTER TABLE feedback ALTER COLUMN id SET DEFAULT feedback_next_id()")
    if sequence is not None:
        op.execute(f"DROP SEQUENCE {sequence}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    last = bind.execute(sa.text("SELECT last_id FROM feedback_counter WHERE id = 1")).scalar_one()
    op.execute("CREATE SEQUENCE feedback_id_seq AS integer OWNED BY feedback.id")
    if last > 0:
        bind.execute(sa.text("SELECT setval('feedback_id_seq', :last)"), {"last": last})
    op.execute("ALTER TABLE feedback ALTER COLUMN id SET DEFAULT nextval('feedback_id_seq')")
    op.execute("DROP FUNCTION feedback_next_id()")
    op.drop_table("feedback_counter")
