"""Profile finalization: a profile being deleted goes once no host holds its settings.

A host holds a profile while its agent reports that profile applied
(``Host.applied_generations``). The reconciler converges such a host to the
remaining profiles, which restores the recorded originals of what only the
deleted profile wanted, and its status write drops the profile from the
applied set. Deleting the host (declaring it gone) lets go as well.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.server.db.tables import Host, Profile
from stortune.server.services import events, rollouts

#: Held while any host may still carry the profile's settings; the reconciler
#: restores them, reports the host's applied generations, and the row goes.
FINALIZER = "stortune.io/restore-settings"


def holders(session: Session) -> dict[str, list[str]]:
    """profile -> hosts whose agent reports it applied, sorted."""
    held: dict[str, list[str]] = {}
    for name, applied in session.execute(select(Host.name, Host.applied_generations).order_by(Host.name)):
        for profile in applied:
            held.setdefault(profile, []).append(name)
    return held


def holding(session: Session, profile: str) -> list[str]:
    """Hosts whose agent reports ``profile`` as applied: its deletion waits for them."""
    return holders(session).get(profile, [])


def release_finished(session: Session, now: datetime) -> list[str]:
    """Remove profiles being deleted that no host holds any more; part of the caller's transaction."""
    deleting = session.scalars(select(Profile).where(Profile.deletion_timestamp.is_not(None))).all()
    if not deleting:
        return []  # the common case: no need to look at every host
    held = holders(session)
    released = []
    for row in deleting:
        # A host pinned by the deletion's rollout at a live generation still holds it (its wave
        # has not come), even when it has not reported it applied yet.
        if row.name not in held and not rollouts.held_live(session, row.name):
            session.delete(row)
            rollouts.forget(session, row.name)
            events.record(session, kind="StorageProfile", name=row.name, profile=row.name, type="Normal",
                          reason="Deleted", message="no host holds its settings any more", now=now)
            released.append(row.name)
    return released
