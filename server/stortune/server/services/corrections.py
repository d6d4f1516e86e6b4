"""The settings an agent set back on its own, recorded like the reconciler's corrections.

An agent re-applies its stored desired state when it starts and when its devices change; a
setting stortune had applied that it found changed and set back is drift the reconciler never
saw (by its next look the value is back). The agent reports each with its heartbeats
(``stortune.schemas.corrections``); here each becomes a Drift event (what was found, why it had
changed, what it was put back to) and a Corrected event; the caller counts them after the
commit. The host's status keeps the last seq recorded for the agent's epoch, so a batch sent
twice (a held watch and a heartbeat carrying the same ones, an answer lost) is recorded once.

An agent holds its own host key, so a rogue one may report anything for its host: the same
(device, tunable, cause) within a window raises one series' count, past the host's budget a
minute the rest are summed up in one event (``event_series``), batches past ``LIMIT`` per host
are not taken (the route), and a correction whose profile/rule the host's settings table does
not hold, or whose device its topology does not, is recorded on the host without the profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from stortune.schemas.corrections import Correction, CorrectionBatch
from stortune.schemas.topology import HOST_TARGET
from stortune.server.db.tables import Host
from stortune.server.errors import NotFound
from stortune.server.services.event_series import Entries, Entry, Ledger
from stortune.server.services.versions import next_resource_version

KIND = "Host"
#: The key of host.status holding {"epoch", "seq"}: the agent's last correction recorded.
MARK = "agentCorrections"
#: The per-host rate limit of batches taken (``--rate-limit agent-corrections=N``), and its default:
#: an agent sends one with a heartbeat, every 10 s at the fastest pace.
LIMIT = "agent-corrections"
BATCHES_PER_MINUTE = 12.0


@dataclass(frozen=True)
class Recorded:
    #: The agent may drop its corrections up to this seq.
    upto: int
    #: The ones recorded now (not seen before): to count.
    new: tuple[Correction, ...] = ()


def record(session: Session, name: str, batch: CorrectionBatch, now: datetime, *, per_minute: int
           ) -> Recorded:
    """Record the corrections of ``batch`` not recorded before; commits when there are any.
    ``per_minute``: the host's budget of new event series a minute.

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
    ledger = Ledger(session, name, mark, per_minute=per_minute, now=now)
    _write(ledger, _Applied.of(host), new, missed=new[0].seq - seen - 1, per_minute=per_minute)
    host.status = {**host.status, MARK: {"epoch": batch.epoch, "seq": new[-1].seq, **ledger.dump()}}
    host.resource_version = version
    session.commit()
    return Recorded(upto=new[-1].seq, new=new)


def _write(ledger: Ledger, applies: _Applied, new: Sequence[Correction], *, missed: int, per_minute: int
           ) -> None:
    """The events of ``new``: one series per (device, tunable, cause, profile it is attributed to)."""
    if missed > 0:
        ledger.add("missed", lambda n: [Entry("Warning", "Drift", f"{n} earlier setting(s) the agent set back"
                                              " on its own were not reported (it had more than it keeps)")],
                   occurrences=missed, budgeted=False)
    untold = 0
    for c in new:
        ok = applies.holds(c)
        key = " ".join((c.device, c.tunable, c.cause, c.profile if ok else "-"))
        untold += not ledger.add(key, _pair(c, ok), profile=c.profile if ok else None)
    if untold:
        ledger.add("untold", lambda n: [Entry(
            "Warning", "Drift", f"{n} more setting(s) the agent set back on its own were not recorded one by"
            f" one: more than {per_minute} a minute from this host (each is counted in"
            " stortune_drift_events_total)")], occurrences=untold, budgeted=False)


def _pair(c: Correction, attributed: bool) -> Entries:
    pair = (Entry("Warning", "Drift", c.drift_message(attributed)),
            Entry("Normal", "Corrected", c.corrected_message(attributed)))
    return lambda _: pair


@dataclass(frozen=True)
class _Applied:
    """What the host applies: its settings table's (profile, rule) pairs, its topology's devices."""

    rules: frozenset[tuple[str, str]]
    devices: frozenset[str]

    @classmethod
    def of(cls, host: Host) -> _Applied:
        rows = [d for d in host.status.get("devices", []) if isinstance(d, dict)]
        held = (host.topology or {}).get("devices", [])
        return cls(frozenset((str(d.get("profile")), str(d.get("rule"))) for d in rows),
                   frozenset(str(d.get("name")) for d in held if isinstance(d, dict)))

    def holds(self, c: Correction) -> bool:
        return (c.profile, c.rule) in self.rules and (c.device == HOST_TARGET or c.device in self.devices)
