"""resourceVersion: one counter ordering every write of every object.

Bumping it is the first statement of each write, so on PostgreSQL the row lock
on the counter serialises writers in one order (counter, then objects) and two
writers can never deadlock on each other's rows. While it stands still nothing
has changed, which is what cached GET answers and the reconciler's host views
rely on: they read it often, through one ``VersionReader``.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.tables import RESOURCE_VERSION, Counter

# Built once: it is read for nearly every GET and every drift check.
_CURRENT = select(Counter.value).where(Counter.name == RESOURCE_VERSION)


def next_resource_version(session: Session) -> int:
    stmt = (
        update(Counter)
        .where(Counter.name == RESOURCE_VERSION)
        .values(value=Counter.value + 1)
        .returning(Counter.value)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).scalar_one()


def current_resource_version(session: Session) -> int:
    return session.execute(_CURRENT).scalar_one()


class CounterQuery:
    """The counter read through a pooled DBAPI connection, outside any ORM session.

    One SELECT sees one snapshot by itself, so it needs neither a session nor a
    transaction of ours: about a seventh of the CPU of reading it in a session
    on SQLite, a third on PostgreSQL. It is read for nearly every GET and every
    drift check.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # No parameters: the same text runs on either driver, whatever its paramstyle.
        self._sql = str(_CURRENT.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))

    def __call__(self) -> int:
        connection = self._engine.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                cursor.execute(self._sql)
                row = cursor.fetchone()
            finally:
                cursor.close()
        finally:
            connection.close()  # back to the pool, which ends the driver's transaction if it began one
        if row is None:
            raise LookupError("the resourceVersion counter is missing: is the database migrated?")
        return int(row[0])


class VersionReader:
    """The current resourceVersion for many concurrent requests, one database lookup per batch.

    A request must see every write committed before it arrived, so it never
    joins a lookup already under way: it waits for the next one, which starts
    when the current one ends and answers everyone who arrived meanwhile.
    Under load one thread hop serves dozens of requests (a hop costs more
    CPU than the lookup itself). The lookups run in a thread of their own: a
    request never waits for one behind renders in the API's threadpool, and a
    plain executor hop costs less than anyio's. ``close()`` ends that thread.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        engine = sessions.kw.get("bind")
        if not isinstance(engine, Engine):
            raise TypeError("VersionReader needs a sessionmaker bound to an Engine")
        self._read = CounterQuery(engine)
        self._thread: ThreadPoolExecutor | None = None  # made on first use, again after close()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: asyncio.Future[int] | None = None  # the next lookup's answer
        self._runner: asyncio.Task[None] | None = None

    async def current(self) -> int:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests start one per client): start afresh
            self._loop, self._waiting, self._runner = loop, None, None
        if self._waiting is None:
            self._waiting = loop.create_future()
        answer = self._waiting
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        # shield: one caller going away must not cancel the lookup the others wait for
        return await asyncio.shield(answer)

    async def _run(self) -> None:
        while self._waiting is not None:
            answer, self._waiting = self._waiting, None
            try:
                if self._thread is None:
                    self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stortune-versions")
                version = await asyncio.get_running_loop().run_in_executor(self._thread, self._read)
            except Exception as exc:  # every waiter gets it, as if it had looked itself
                answer.set_exception(exc)
            else:
                answer.set_result(version)

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)
