"""The Alembic migrations create exactly the tables the models describe."""

from __future__ import annotations

from datetime import UTC, datetime

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
    engine = make_engine(f"sqlite:///{tmp_path}/p.db", statement_timeout_s=12)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 12_000  # db_statement_timeout_s
    finally:
        engine.dispose()


def test_stored_size_texts_keep_the_meaning_they_were_stored_with(db_url: str) -> None:
    """Hostile to an upgrade: 0008 read a profile's bare '4T' as 4 x 10^12 bytes, the one size rule
    reads it as 4 TiB. Read that way, 'min: 4T' stops selecting the 4 TB disks it was written for
    and the reconciler puts their settings back everywhere. 0009 rewrites what changed meaning."""
    from alembic import command
    from sqlalchemy.orm import Session

    from stortune.schemas.profile import StorageProfile
    from stortune.server.db.tables import BenchmarkSchedule, Profile

    stored = [  # (as 0008 stored it, the bytes 0008 read, as 0009 leaves it)
        ("4T", 4 * 10**12, "4TB"), ("1.5t", 1_500_000_000_000, "1.5TB"), ("500G", 500 * 10**9, "500GB"),
        ("1.0005K", 1000, 1000), ("2 M", 2_000_000, "2MB"), ("512GiB", 512 << 30, "512GiB"),
        ("4TB", 4 * 10**12, "4TB"), ("100", 100, "100"), (4096, 4096, 4096), ("1.5Ki", 1536, "1.5Ki"),
    ]
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(db_url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0008")
            command.downgrade(cfg, "0008")  # the PostgreSQL test database may be at head already
        rules = [{"name": f"r{i}", "match": {"size": {"min": old}}, "settings": {"read_ahead_kb": 4096}}
                 for i, (old, _, _) in enumerate(stored)]
        spec = {"hostSelector": {"matchLabels": {"role": "db"}}, "priority": 0, "rules": rules}
        now = datetime(2026, 1, 1, tzinfo=UTC)
        with Session(engine) as session:
            session.add(Profile(name="sized", uid="u-1", generation=3, resource_version=7, spec=spec,
                                labels={}, annotations={}, status={}, finalizers=[], created_at=now,
                                updated_at=now, deletion_timestamp=None))
            # A BenchmarkSpec's device target is the same match, read by the same rule.
            session.add(BenchmarkSchedule(
                name="nightly", cron="0 3 * * *", suspended=False, created_at=now, updated_at=now,
                created_by="tests", next_due_at=None, last_fired_at=None, last_message="",
                spec={"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "nightly"},
                      "spec": {"target": {"device": {"size": {"min": "1T", "max": "2TB"}}}}}))
            session.commit()
        upgrade(engine)
        with Session(engine) as session:
            row = session.get(Profile, "sized")
            assert row is not None and (row.generation, row.resource_version) == (3, 7)
            assert [r["match"]["size"]["min"] for r in row.spec["rules"]] == [now_ for _, _, now_ in stored]
            profile = StorageProfile.model_validate({"metadata": {"name": "sized"}, "spec": row.spec})
            schedule = session.get(BenchmarkSchedule, "nightly")
            assert schedule is not None
            assert schedule.spec["spec"]["target"]["device"]["size"] == {"min": "1TB", "max": "2TB"}
        assert [r.match.size.bounds()[0] for r in profile.spec.rules if r.match and r.match.size] == [
            meant for _, meant, _ in stored]
    finally:
        engine.dispose()
