"""Engines and sessions, SQLite or PostgreSQL.

SQLite runs in WAL mode (readers never block the writer) with a busy timeout
and foreign keys on. sqlite3's own transaction handling is switched off so
SQLAlchemy emits BEGIN itself and reads inside a transaction see one snapshot.

Every write transaction starts by bumping the resourceVersion counter
(services/versions.py). On SQLite that first statement waits for the write
lock under the busy timeout; a transaction that read first and wrote later
would instead fail at once with "database is locked" if another writer had
committed in between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, sessionmaker

from stortune.server import statedir

SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Threads that may hold a connection at once: the API's threadpool (app.py sets
#: it) and the reconciler's asyncio.to_thread workers (at most 32).
API_THREADS = 16
POOL_SIZE = API_THREADS  # connections kept open: one per API thread, none reopened per request
POOL_OVERFLOW = API_THREADS + 32 - POOL_SIZE


#: SQLite's own files beside the database (its write-ahead log and shared-memory index).
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def private_sqlite_file(url: str) -> None:
    """The database file of a SQLite URL, and the directories made for it, readable by this user
    alone (statedir.py). SQLite makes its WAL and index with the database's mode."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    statedir.make_private_dir(path.parent)
    statedir.make_private_file(path)
    for suffix in SQLITE_COMPANIONS:  # left from a start before this one
        statedir.restrict(path.with_name(path.name + suffix))


def make_engine(url: str) -> Engine:
    # The pool must never be smaller than the number of threads that can ask for a
    # connection. Otherwise threads queue for one while the requests that hold
    # the connections wait for a free thread to close their sessions: a deadlock
    # that only the pool timeout breaks.
    pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:"):
            pool = {}  # one connection per thread (SingletonThreadPool) for an in-memory database
        else:
            private_sqlite_file(url)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **pool)
        _configure_sqlite(engine)
        return engine
    # pool_pre_ping: a PostgreSQL restart must not turn the next request into a 500.
    return create_engine(url, pool_pre_ping=True, **pool)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN (below)
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across crashes in WAL mode
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: rows are rendered into responses after the commit.
    return sessionmaker(engine, expire_on_commit=False)
