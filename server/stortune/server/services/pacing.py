"""How often agents heartbeat: the fleet's heartbeat rate stays within a budget.

A small fleet renews its leases every ``heartbeat_interval_s`` (Kubernetes'
node lease: 10 s). Past ``max_heartbeats_per_s`` times that interval hosts, the
interval grows with the fleet, so the control plane's heartbeat load stays
flat however many agents register (Nomad paces its clients the same way).
The lease grows in the same proportion: a host is still declared gone after
the same number of missed heartbeats. Agents learn their pace from every
registration and heartbeat answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.tables import HostLease

if TYPE_CHECKING:
    from stortune.server.settings import Settings


@dataclass(frozen=True)
class Pace:
    interval_s: float
    lease_s: float


def pace(hosts: int, *, interval_s: float, lease_s: float, max_per_s: float) -> Pace:
    interval = max(interval_s, hosts / max_per_s)
    return Pace(interval_s=interval, lease_s=lease_s * interval / interval_s)


class FleetSize:
    """The fleet's pace from how many hosts hold a lease, counted again at most every ``ttl_s``.

    Every heartbeat asks; the count runs in a session of its own, so the
    caller's transaction stays a write that takes the lock first (db/engine.py).
    """

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counted: tuple[float, int] | None = None

    def get(self) -> int:
        now = self._clock()
        with self._lock:
            if self._counted is not None and now - self._counted[0] < self._ttl:
                return self._counted[1]
        with self._sessions() as session:
            count = session.scalar(select(func.count()).select_from(HostLease)) or 0
        with self._lock:
            self._counted = (now, count)
        return count

    def pace(self, settings: Settings, *, joining: bool = False) -> Pace:
        """Heartbeat interval and lease for this fleet (``joining``: counting a host registering now)."""
        return pace(self.get() + joining, interval_s=settings.heartbeat_interval_s,
                    lease_s=settings.lease_duration_s, max_per_s=settings.max_heartbeats_per_s)
