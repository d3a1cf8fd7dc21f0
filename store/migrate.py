"""Alembic migrations, run programmatically: `liveloop store migrate` and the server's start-up check.

The schema is only ever changed by these migrations (never `create_all`), so a live database is
upgraded in place and its rows kept.
"""

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


def _alembic_config(engine: Engine) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    command.upgrade(_alembic_config(engine), revision)
    return current_revision(engine)


def downgrade(engine: Engine, revision: str) -> str | None:
    command.downgrade(_alembic_config(engine), revision)
    return current_revision(engine)
