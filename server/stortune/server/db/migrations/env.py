"""Alembic environment: uses the caller's connection when given one (the server
does), else the URL from the config (``alembic -x`` style use by hand)."""

from __future__ import annotations

from alembic import context

from stortune.server.db.engine import make_engine
from stortune.server.db.tables import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url, "no sqlalchemy.url in the Alembic config"
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run them against a database")
run()
