"""The store's schema revisions, one Alembic migration a file, in order."""
