"""Alembic environment: runs against the engine handed in by `liveloop.store.migrate`."""

from alembic import context

from liveloop.store.models import Base

config = context.config
engine = config.attributes["engine"]

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    context.run_migrations()
