"""An upgrade from every earlier schema revision, with rows in every table, on SQLite and PostgreSQL.

A migration that passes on an empty database can still fail on a fleet's: a NOT NULL column
added without a default, a data move that misses rows, a constraint the old rows break. Each
test starts a new database at one earlier revision, puts two rows into every table that
revision has (values made from each column's type, foreign keys pointing at the rows made
before), upgrades to head and checks that nothing was lost and the schema is the models'.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from stortune.server.db.engine import make_engine
from stortune.server.db.migrate import alembic_config, upgrade
from stortune.server.db.tables import Base
from tests.server.conftest import new_pg_database

SCRIPTS = ScriptDirectory.from_config(alembic_config("sqlite://"))
HEAD = SCRIPTS.get_current_head()
EARLIER = sorted(r.revision for r in SCRIPTS.walk_revisions() if r.revision != HEAD)
ROWS = 2
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A database of its own (the shared PostgreSQL test database is kept at head)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    yield from new_pg_database("stortune_upgrade")


def _value(column: sa.Column[Any], row: int, made: dict[str, list[dict[str, Any]]]) -> Any:
    """A value of the column's type for row ``row``; a foreign key takes the referenced row's."""
    for fk in column.foreign_keys:
        target = made[fk.column.table.name]
        return target[row % len(target)][fk.column.name]
    kind = column.type
    if isinstance(kind, sa.Boolean):
        return row % 2 == 1
    if isinstance(kind, sa.Integer):
        return row + 1
    if isinstance(kind, sa.Float | sa.Numeric):
        return float(row) + 0.5
    if isinstance(kind, sa.DateTime):
        return T0 + timedelta(minutes=row)
    if isinstance(kind, sa.JSON):
        return {}
    if isinstance(kind, sa.LargeBinary):
        return bytes([row]) * 4
    if isinstance(kind, sa.String):  # Text included
        text = f"{column.name[:8]}-{row}"
        return text[:kind.length] if kind.length else text
    raise AssertionError(f"{column.table.name}.{column.name}: no value for type {kind!r}")


def _seed(conn: sa.Connection) -> dict[str, int]:
    meta = sa.MetaData()
    meta.reflect(conn)
    made: dict[str, list[dict[str, Any]]] = {}
    counts = {}
    for table in meta.sorted_tables:
        if table.name == "alembic_version":
            continue
        existing = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
        rows = [{c.name: _value(c, i, made) for c in table.columns
                 if not (c.autoincrement is True and c.primary_key)} for i in range(ROWS)]
        conn.execute(table.insert(), rows)
        made[table.name] = [dict(r) for r in conn.execute(sa.select(table)).mappings()]
        counts[table.name] = existing + ROWS
    return counts


@pytest.mark.parametrize("revision", EARLIER)
def test_upgrade_from_every_earlier_revision_keeps_every_row(fresh_url: str, revision: str) -> None:
    engine = make_engine(fresh_url)
    try:
        cfg = alembic_config(fresh_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        with engine.begin() as conn:
            seeded = _seed(conn)
        upgrade(engine)
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert context.get_current_revision() == HEAD
            assert compare_metadata(context, Base.metadata) == []
            after = sa.MetaData()
            after.reflect(conn)
            for name, count in seeded.items():
                if name in after.tables:  # a table a later revision replaced is checked below
                    assert conn.execute(sa.select(sa.func.count()).select_from(after.tables[name])
                                        ).scalar_one() == count, name
            if "hosts" in seeded:  # 0003 moved each host's lease into host_leases
                leases = conn.execute(sa.text("SELECT COUNT(*) FROM host_leases")).scalar_one()
                assert leases == (seeded["hosts"] if revision < "0003" else seeded["host_leases"])
    finally:
        engine.dispose()
