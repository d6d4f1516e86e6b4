"""Event series for what an agent reports: aggregated by key and opened within a per-host budget.

Kubernetes aggregates events (one row, its ``count`` and ``lastTimestamp`` raised) and rate-limits
them per source; this does the same for the events of reports a host's agent makes (its own
corrections): an agent holds its own host key, so whatever it sends must not grow the events
table without bound. A series is the events written for one key (a Drift and a Corrected event)
raised for that key again within ``WINDOW`` of its first; opening one spends the host's budget
(a token bucket of ``per_minute``); past it the caller sums the rest up in one series of its own.
The ledger (bucket and open series, bounded) lives in the host's status, written in the caller's
transaction, so every server sharing the database spends one budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from stortune.server.api.buckets import spend_one
from stortune.server.db.tables import Event
from stortune.server.services import events
from stortune.server.services.events import EventType

#: A key's events are raised, not written again, this long after its first (Kubernetes: 10 min).
WINDOW = timedelta(minutes=10)
#: Open series kept per host; an older one's key opens a new series (within the budget).
MAX_SERIES = 64


@dataclass(frozen=True)
class Entry:
    type: EventType
    reason: str
    message: str


#: The entries of a series, given how many occurrences it now stands for.
Entries = Callable[[int], Sequence[Entry]]


class Ledger:
    """One host's open series and budget, loaded from and dumped back to its status."""

    def __init__(self, session: Session, host: str, stored: Mapping[str, Any], *, per_minute: int,
                 now: datetime) -> None:
        self._session, self._host, self._now, self._per_minute = session, host, now, per_minute
        budget = stored.get("budget") or {}
        self._tokens = float(budget.get("tokens", per_minute))
        self._at = datetime.fromisoformat(budget["at"]) if "at" in budget else now
        self._series: dict[str, dict[str, Any]] = {
            k: v for k, v in (stored.get("series") or {}).items()
            if now - datetime.fromisoformat(v["first"]) < WINDOW}

    def add(self, key: str, entries: Entries, *, profile: str | None = None, occurrences: int = 1,
            budgeted: bool = True) -> bool:
        """Raise ``key``'s open series by ``occurrences``, or open one; False when opening it is past
        the budget (nothing written). ``budgeted=False``: a summary, at most one per key and window."""
        rows = self._open(key)
        if rows is not None:
            for row, entry in zip(rows, entries(rows[0].count + occurrences), strict=True):
                row.count += occurrences
                row.last_timestamp, row.message = self._now, entry.message
            return True
        if budgeted and not self._spend():
            return False
        made = [events.record(self._session, kind="Host", name=self._host, host=self._host, profile=profile,
                              type=e.type, reason=e.reason, message=e.message, now=self._now,
                              count=occurrences) for e in entries(occurrences)]
        self._session.flush()
        self._series[key] = {"first": self._now.isoformat(), "ids": [row.id for row in made]}
        return True

    def dump(self) -> dict[str, Any]:
        newest = sorted(self._series.items(), key=lambda kv: str(kv[1]["first"]))[-MAX_SERIES:]
        return {"budget": {"tokens": self._tokens, "at": self._at.isoformat()}, "series": dict(newest)}

    def _open(self, key: str) -> list[Event] | None:
        series = self._series.get(key)
        if series is None:
            return None
        rows = [self._session.get(Event, i) for i in series["ids"]]
        return None if any(r is None for r in rows) else [r for r in rows if r is not None]

    def _spend(self) -> bool:
        self._tokens, wait = spend_one(self._tokens, self._at, self._now, rate=self._per_minute / 60.0,
                                       burst=self._per_minute)
        self._at = max(self._at, self._now)
        return wait == 0
