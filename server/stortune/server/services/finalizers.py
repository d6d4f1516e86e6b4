"""Profile finalization: a profile being deleted goes once no host holds its settings."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.server.db.tables import Host, Profile
from stortune.server.services import events

#: Held while any host may still carry the profile's settings; the reconciler
#: restores them, reports the host's applied generations, and the row goes.
FINALIZER = "stortune.io/restore-settings"


def holding(session: Session, profile: str) -> list[str]:
    """Hosts whose agent reports ``profile`` as applied: its deletion waits for them."""
    rows = session.execute(select(Host.name, Host.applied_generations)).all()
    return sorted(name for name, applied in rows if profile in applied)


def release_finished(session: Session, now: datetime) -> list[str]:
    """Remove profiles being deleted that no host holds any more; part of the caller's transaction."""
    released = []
    for row in session.scalars(select(Profile).where(Profile.deletion_timestamp.is_not(None))).all():
        if not holding(session, row.name):
            session.delete(row)
            events.record(session, kind="StorageProfile", name=row.name, profile=row.name, type="Normal",
                          reason="Deleted", message="every host restored its settings", now=now)
            released.append(row.name)
    return released
