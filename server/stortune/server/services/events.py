"""Events: what happened to which object, deduplicated like Kubernetes events."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.server.db.tables import Event

EventType = Literal["Normal", "Warning"]


def record(
    session: Session,
    *,
    kind: str,
    name: str,
    type: EventType,
    reason: str,
    message: str,
    now: datetime,
    host: str | None = None,
    profile: str | None = None,
    count: int = 1,
) -> Event:
    """Add an event standing for ``count`` occurrences; part of the caller's transaction.

    An event identical to the object's previous one only raises its count, so a
    flapping host shows one line with count 40, not 40 lines.
    """
    last = session.scalars(
        select(Event)
        .where(Event.involved_kind == kind, Event.involved_name == name)
        .order_by(Event.id.desc())
        .limit(1)
    ).first()
    if last is not None and (last.type, last.reason, last.message, last.host, last.profile) == (
        type, reason, message, host, profile,
    ):
        last.count += count
        last.last_timestamp = now
        return last
    event = Event(
        involved_kind=kind, involved_name=name, type=type, reason=reason, message=message,
        host=host, profile=profile, first_timestamp=now, last_timestamp=now, count=count,
    )
    session.add(event)
    return event


def list_events(
    session: Session, *, host: str | None = None, profile: str | None = None, limit: int = 100,
    hosts: Collection[str] | None = None,
) -> Sequence[Event]:
    """Newest first; ``hosts``: only events about these hosts."""
    stmt = select(Event)
    if hosts is not None:
        stmt = stmt.where(Event.host.in_(sorted(hosts)))
    if host is not None:
        stmt = stmt.where(Event.host == host)
    if profile is not None:
        stmt = stmt.where(Event.profile == profile)
    return session.scalars(
        stmt.order_by(Event.last_timestamp.desc(), Event.id.desc()).limit(limit)
    ).all()
