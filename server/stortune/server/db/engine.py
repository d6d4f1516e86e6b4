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

import math
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, sessionmaker

from stortune.server import statedir

#: Settings.db_statement_timeout_s and db_connect_timeout_s, for engines made without settings.
DEFAULT_STATEMENT_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
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


def statement_timeout_ms(seconds: float) -> int:
    """PostgreSQL's statement_timeout for ``seconds``: whole milliseconds, at least one (0 turns it off)."""
    return max(1, round(seconds * 1000))


def connect_args(url: str, *, statement_timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    """The driver's arguments that bound every wait on the database.

    PostgreSQL: a connection attempt gives up after ``connect_timeout_s`` and a statement
    (waiting on a lock included) is cancelled after ``statement_timeout_s``, so a database
    that hangs makes calls fail (503) instead of holding every thread. The URL's own
    ``options`` come after ours: a statement_timeout given there wins. SQLite: a writer waits
    that long for another's lock (the busy timeout)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {"timeout": statement_timeout_s}
    given = parsed.query.get("options", ())
    options = [f"-c statement_timeout={statement_timeout_ms(statement_timeout_s)}",
               *([given] if isinstance(given, str) else given)]
    # libpq takes whole seconds, and treats anything under 2 as 2.
    return {"connect_timeout": max(2, math.ceil(connect_timeout_s)), "options": " ".join(options)}


def make_engine(url: str, *, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
                connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> Engine:
    # The pool must never be smaller than the number of threads that can ask for a
    # connection. Otherwise threads queue for one while the requests that hold
    # the connections wait for a free thread to close their sessions: a deadlock
    # that only the pool timeout breaks.
    pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    args = connect_args(url, statement_timeout_s=statement_timeout_s, connect_timeout_s=connect_timeout_s)
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:"):
            pool = {}  # one connection per thread (SingletonThreadPool) for an in-memory database
        else:
            private_sqlite_file(url)
        engine = create_engine(url, connect_args=args, **pool)
        _configure_sqlite(engine, busy_timeout_ms=round(statement_timeout_s * 1000))
        return engine
    # pool_pre_ping: a PostgreSQL restart must not turn the next request into a 500.
    return create_engine(url, pool_pre_ping=True, connect_args=args, **pool)


def _configure_sqlite(engine: Engine, *, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN (below)
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across crashes in WAL mode
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: rows are rendered into responses after the commit.
    return sessionmaker(engine, expire_on_commit=False)
