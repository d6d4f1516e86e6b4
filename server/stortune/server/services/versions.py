"""resourceVersion: one counter ordering every write of every object.

Bumping it is the first statement of each write, so on PostgreSQL the row lock
on the counter serialises writers in one order (counter, then objects) and two
writers can never deadlock on each other's rows.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from stortune.server.db.tables import RESOURCE_VERSION, Counter


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
    return session.scalars(select(Counter.value).where(Counter.name == RESOURCE_VERSION)).one()
