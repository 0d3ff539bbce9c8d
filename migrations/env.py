"""Alembic environment for the shadow DuckDB database.

``shadow.storage.database`` runs this programmatically and hands over a live connection in
``config.attributes["connection"]`` (so the migration shares the caller's DuckDB instance
and file lock); the plain ``alembic`` CLI path builds its own engine from the URL.
"""

from __future__ import annotations

from alembic import context
from alembic.ddl.impl import DefaultImpl
from sqlalchemy import Connection, create_engine, pool

from shadow.storage.models import Base


class AlembicDuckDBImpl(DefaultImpl):
    """Teach Alembic the ``duckdb`` dialect name; DuckDB runs DDL inside transactions."""

    __dialect__ = "duckdb"
    transactional_ddl = True


config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``) without touching a database."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through the caller's connection if given, else through a fresh engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
