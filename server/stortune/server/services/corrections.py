"""The settings an agent set back on its own, recorded like the reconciler's corrections.

An agent re-applies its stored desired state when it starts and when its devices change; a
setting stortune had applied that it found changed and set back is drift the reconciler never
saw (by its next look the value is back). The agent reports each with its heartbeats
(``stortune.schemas.corrections``); here each becomes a Drift event (what was found, why it had
changed, what it was put back to) and a Corrected event; the caller counts them after the
commit. The host's status keeps the last seq recorded for the agent's epoch, so a batch sent
twice (a held watch and a heartbeat carrying the same ones, an answer lost) is recorded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from stortune.schemas.corrections import Correction, CorrectionBatch
from stortune.server.db.tables import Host
from stortune.server.errors import NotFound
from stortune.server.services import events
from stortune.server.services.versions import next_resource_version

KIND = "Host"
#: The key of host.status holding {"epoch", "seq"}: the agent's last correction recorded.
MARK = "agentCorrections"


@dataclass(frozen=True)
class Recorded:
    #: The agent may drop its corrections up to this seq.
    upto: int
    #: The ones recorded now (not seen before): to count.
    new: tuple[Correction, ...] = ()


def record(session: Session, name: str, batch: CorrectionBatch, now: datetime) -> Recorded:
    """Record the corrections of ``batch`` not recorded before; commits when there are any.

    The resourceVersion counter is taken first, as every host write does: it also orders two
    calls carrying the same batch, so the second finds the first's mark."""
    version = next_resource_version(session)
    host = session.get(Host, name)
    if host is None:  # deleted since the lease was renewed
        session.rollback()
        raise NotFound(KIND, name)
    mark = host.status.get(MARK) or {}
    seen = int(mark.get("seq", 0)) if mark.get("epoch") == batch.epoch else 0
    new = tuple(c for c in batch.items if c.seq > seen)
    if not new:
        session.rollback()
        return Recorded(upto=seen)
    def event(type: events.EventType, reason: str, message: str, profile: str | None = None) -> None:
        events.record(session, kind=KIND, name=name, host=name, profile=profile, type=type, reason=reason,
                      message=message, now=now)

    missed = new[0].seq - seen - 1
    if missed > 0:
        event("Warning", "Drift", f"{missed} earlier setting(s) the agent set back on its own were not"
              " reported (it had more than it keeps)")
    for c in new:
        event("Warning", "Drift", c.drift_message(), c.profile)
        event("Normal", "Corrected", c.corrected_message(), c.profile)
    host.status = {**host.status, MARK: {"epoch": batch.epoch, "seq": new[-1].seq}}
    host.resource_version = version
    session.commit()
    return Recorded(upto=new[-1].seq, new=new)
