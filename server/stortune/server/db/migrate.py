"""Bring a database to the newest schema with the packaged Alembic migrations."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolates '%': escape it (URL-encoded passwords contain it).
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest packaged revision (reading the scripts once per process)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def at_head(engine: Engine) -> bool:
    """The database's schema is the newest: every start but the first after an upgrade, where
    running Alembic would load its environment and every migration script only to do nothing."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return False
        current = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    return current == {head_revision()}


def upgrade(engine: Engine) -> None:
    """Migrate to head over ``engine``, so the same connection settings (pragmas) apply.

    On SQLite, foreign keys are off while migrating: a batch migration recreates a table and
    drops the old one, and with foreign keys on that DROP deletes, ON DELETE CASCADE, every row
    referring to it (upgrading across 0003 emptied host_conditions_history). The pragma is a
    no-op inside a transaction, so it is set on the driver's connection before BEGIN, and the
    references are checked before the migration commits."""
    if at_head(engine):
        return
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        if sqlite and driver is not None:
            driver.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    # Not the API's statement timeout: a migration rewrites tables and waits for
                    # other replicas' queries to end; cancelled halfway it would only start again.
                    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                if sqlite and (broken := conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                    raise RuntimeError(f"the migrated database has rows whose references are gone:"
                                       f" {broken[:5]}")
        finally:
            if sqlite and driver is not None:
                driver.execute("PRAGMA foreign_keys=ON")
