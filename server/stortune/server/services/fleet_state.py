"""The hosts' stored state, kept in memory: one record per host, by resourceVersion.

What a scrape (/metrics) and the host list's filters and counts read: neither may
cost a query of every host (nor, worse, a call to every agent). Every host write
bumps the one resourceVersion counter and stamps the row with it, so a refresh
reads the counter and, only when it moved, the rows written since the last
refresh plus the list of names (deletions). An idle fleet's scrape is then one
counter read. A full reload every ``full_every``
seconds mends a row a concurrent PostgreSQL transaction stamped with a version
older than one already read.

Only what the gauges and the list's filters need is kept: never the host key hash, topology, tokens or
facts beyond the named ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.tables import BenchmarkRun, Experiment, Host
from stortune.server.models.hosts import rejected_at, rejected_profiles
from stortune.server.services.versions import current_resource_version

#: (device, tunable, desired, observed): a row of the host's settings table.
Setting = tuple[str, str, int | str | None, int | str | None]


@dataclass(frozen=True)
class HostRecord:
    name: str
    version: int
    address: str
    agent_version: str
    kernel: str
    #: Condition type -> (status "True" | "False" | "Unknown", reason).
    conditions: Mapping[str, tuple[str, str]]
    labels: Mapping[str, str]
    settings: tuple[Setting, ...]
    #: Profile -> the generation the agent last applied.
    applied: Mapping[str, int] = field(default_factory=dict)
    #: Profiles with a value the host cannot set (an error in its settings table).
    rejected: frozenset[str] = frozenset()
    #: (profile, generation) of those values: what a rollout of that generation counts as blocked.
    rejected_at: frozenset[tuple[str, int | None]] = frozenset()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _setting_value(value: Any) -> int | str | None:
    if isinstance(value, bool):  # JSON true is no tunable value
        return None
    return value if isinstance(value, int | str) else None


def record_of(name: str, *, version: int, address: str, facts: Mapping[str, Any], status: Mapping[str, Any],
              labels: Mapping[str, str], applied: Mapping[str, int] | None = None) -> HostRecord:
    conditions = {str(c.get("type")): (str(c.get("status")), str(c.get("reason", "")))
                  for c in status.get("conditions", []) if isinstance(c, dict)}
    settings = tuple(
        (str(d.get("device", "")), str(d.get("tunable", "")), _setting_value(d.get("desired")),
         _setting_value(d.get("observed")))
        for d in status.get("devices", []) if isinstance(d, dict))
    return HostRecord(name=name, version=version, address=address,
                      agent_version=_text(facts.get("agent_version")), kernel=_text(facts.get("kernel")),
                      conditions=conditions, labels=dict(labels),
                      settings=settings, applied={k: v for k, v in (applied or {}).items()
                                                  if isinstance(k, str) and isinstance(v, int)},
                      rejected=rejected_profiles(status), rejected_at=rejected_at(status))


_COLUMNS = (Host.name, Host.resource_version, Host.address, Host.facts, Host.status, Host.reported_labels,
            Host.labels, Host.applied_generations)


class FleetState:
    """Host records and run counts; ``refresh`` in a thread, read from anywhere."""

    def __init__(self, sessions: sessionmaker[Session] | None = None, *, full_every: float = 300.0,
                 runs_every: float = 15.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._full_every = full_every
        self._runs_every = runs_every
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._version = -1
        self._full_at = float("-inf")
        self._runs_at = float("-inf")
        self.hosts: dict[str, HostRecord] = {}
        self._sorted: tuple[dict[str, HostRecord], list[str]] | None = None
        #: (kind: benchmark | experiment, state) -> how many.
        self.runs: dict[tuple[str, str], int] = {}

    def put(self, records: Iterable[HostRecord]) -> None:
        """Set records directly (benchmarks of the scrape; tests)."""
        with self._lock:
            self.hosts = {**self.hosts, **{r.name: r for r in records}}

    def snapshot(self) -> tuple[Mapping[str, HostRecord], list[str]]:
        """The records and their names sorted, as of one refresh: sorted again only after the
        records changed."""
        hosts = self.hosts  # replaced, never changed in place, by every refresh
        kept = self._sorted
        if kept is None or kept[0] is not hosts:
            kept = self._sorted = (hosts, sorted(hosts))
        return kept

    def refresh(self) -> None:
        if self._sessions is None:
            return
        with self._lock, self._sessions() as session:
            now = self._monotonic()
            version = current_resource_version(session)
            full = now - self._full_at >= self._full_every
            if full or version != self._version:
                since = -1 if full else self._version
                self._load(session, since, full)
                self._version = version
                if full:
                    self._full_at = now
            if now - self._runs_at >= self._runs_every:
                self.runs = self._count_runs(session)
                self._runs_at = now

    def _load(self, session: Session, since: int, full: bool) -> None:
        hosts = {} if full else dict(self.hosts)
        for row in session.execute(select(*_COLUMNS).where(Host.resource_version > since)):
            name, version, address, facts, status, reported, labels, applied = row
            hosts[name] = record_of(name, version=version, address=address, facts=facts or {},
                                    status=status or {}, labels={**(reported or {}), **(labels or {})},
                                    applied=applied or {})
        # Deletions: the names are read again only when the count says some went (at 10,000
        # hosts, reading every name after every write cost more than the rest of a refresh).
        if not full and session.scalar(select(func.count()).select_from(Host)) != len(hosts):
            names = set(session.scalars(select(Host.name)))
            hosts = {n: r for n, r in hosts.items() if n in names}
        self.hosts = hosts

    @staticmethod
    def _count_runs(session: Session) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for kind, table in (("benchmark", BenchmarkRun), ("experiment", Experiment)):
            for state, n in session.execute(select(table.state, func.count()).group_by(table.state)):
                counts[(kind, state)] = n
        return counts
