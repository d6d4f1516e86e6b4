"""The Alembic migrations create exactly the tables the models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from stortune.server.db.engine import make_engine
from stortune.server.db.migrate import MIGRATIONS, alembic_config, upgrade
from stortune.server.db.tables import Base


def test_migrations_match_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        upgrade(engine)  # idempotent
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
            assert context.get_current_revision() == head
            counter = conn.execute(text("SELECT value FROM counters WHERE name = 'resourceVersion'"))
            assert counter.scalar() is not None
    finally:
        engine.dispose()


def test_migrations_ship_inside_the_package() -> None:
    # only-include covers server/stortune, so this directory is in the wheel.
    assert (MIGRATIONS / "env.py").is_file()
    assert list((MIGRATIONS / "versions").glob("0001_*.py"))


def test_sqlite_pragmas(tmp_path: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/p.db")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
    finally:
        engine.dispose()
