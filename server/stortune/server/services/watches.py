"""Agents holding a watch on this server, and their leases kept in batches.

A watch (POST /api/v1/agents/{name}/watch) is a heartbeat the server holds open for up
to ``agent_watch_s``. While it is held the agent is there: its TCP connection says so, and
an agent process that dies closes it. So instead of one request per heartbeat per host,
this server renews the leases of every host holding a watch here in one UPDATE every
third of the lease: at 10,000 hosts that is a statement every few seconds per replica
rather than thousands of requests. A host whose connection closes keeps the lease it had
(at most ``lease_s``), then is declared away by the usual lease expiry; one that vanished
without closing it (power lost) is noticed when the kernel's keepalive gives up on the
connection (cli.py sets it on the listening socket) or, at the latest, when the watch's
hold ends without a new one.

On shutdown ``drain()`` ends every held watch at once with a spread-out reconnect delay:
uvicorn waits for open requests before it stops, and a fleet must not come back in one
burst to the other replicas.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.tables import Host, HostLease
from stortune.server.services import hosts

log = logging.getLogger(__name__)

#: Hosts renewed per statement (SQLite's bound parameters, PostgreSQL's statement size).
BATCH = 500
#: A held watch ends this much earlier or later than agent_watch_s: a fleet that connected
#: together (a server restart) does not come back together every hold.
JITTER = 0.1
#: On shutdown, agents are told to reconnect within this many seconds, spread evenly.
DRAIN_SPREAD_S = 10.0

_RENEW_MANY = (update(HostLease).where(HostLease.name.in_(bindparam("names", expanding=True)))
               .values(renew_time=bindparam("renew"), expire_time=bindparam("expire"))
               .execution_options(synchronize_session=False))


def renew(sessions: sessionmaker[Session], names: Sequence[str], now: datetime, lease_s: float) -> list[str]:
    """Renew the leases of ``names``; -> those whose lease had been declared expired (to revive)."""
    expires = now + timedelta(seconds=lease_s)
    lapsed: list[str] = []
    for start in range(0, len(names), BATCH):
        chunk = list(names[start:start + BATCH])
        with sessions() as session:
            session.execute(_RENEW_MANY, {"names": chunk, "renew": now, "expire": expires})
            lapsed += session.scalars(select(Host.name).where(Host.name.in_(chunk), Host.lease_expired))
            session.commit()
    return lapsed


class WatchBook:
    """Which hosts hold a watch here, until when; renews their leases while they do."""

    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], datetime], *,
                 hold_s: float, lease_s: float, monotonic: Callable[[], float] = time.monotonic,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self._sessions = sessions
        self._clock = clock
        self.hold_s = hold_s
        self.lease_s = lease_s
        self._monotonic = monotonic
        self._uniform = uniform
        #: host -> (watches held, the latest hold's end on the monotonic clock)
        self._held: dict[str, tuple[int, float]] = {}
        self._draining: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the watch route --------------------------------------------------------------
    def hold_for(self) -> float:
        return self.hold_s * self._uniform(1 - JITTER, 1 + JITTER)

    @contextmanager
    def holding(self, name: str, seconds: float) -> Iterator[None]:
        """``name`` holds a watch here for the block (at most ``seconds``)."""
        count, until = self._held.get(name, (0, 0.0))
        self._held[name] = (count + 1, max(until, self._monotonic() + seconds))
        try:
            yield
        finally:
            count, until = self._held[name]
            if count <= 1:
                del self._held[name]
            else:
                self._held[name] = (count - 1, until)

    async def wait(self, seconds: float, receive: Callable[[], Awaitable[object]]) -> None:
        """Until ``seconds`` pass, the caller goes away (the request's ``receive`` returns, with
        http.disconnect: its body was read already) or the server drains."""
        draining = self._draining_event()
        waits = [asyncio.ensure_future(receive()), asyncio.ensure_future(draining.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    @property
    def draining(self) -> bool:
        return self._draining is not None and self._draining.is_set()

    def reconnect_after(self) -> float:
        return self._uniform(0.0, DRAIN_SPREAD_S) if self.draining else 0.0

    def held(self) -> list[str]:
        """Hosts whose watch is held now and not past its end (a half-open connection counts until then)."""
        now = self._monotonic()
        return [name for name, (_, until) in self._held.items() if until > now]

    # -- the renewals -----------------------------------------------------------------
    async def start(self) -> None:
        self._draining_event()
        self._task = asyncio.create_task(self._renew_loop(), name="watch-leases")

    def drain(self) -> None:
        """End every held watch now, and every watch that begins from now on."""
        self._draining_event().set()

    async def stop(self) -> None:
        self.drain()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _draining_event(self) -> asyncio.Event:
        if self._draining is None:
            self._draining = asyncio.Event()
        return self._draining

    async def renew_once(self) -> int:
        names = self.held()
        if not names:
            return 0
        lapsed = await asyncio.to_thread(renew, self._sessions, names, self._clock(), self.lease_s)
        for name in lapsed:  # the leader declared it away while its watch was held here
            await asyncio.to_thread(self._revive, name)
        return len(names)

    def _revive(self, name: str) -> None:
        with self._sessions() as session:
            hosts.revive(session, name, self._clock())

    async def _renew_loop(self) -> None:
        period = self.lease_s / 3
        while True:
            await asyncio.sleep(period)
            try:
                renewed = await self.renew_once()
                log.debug("renewed %d watching hosts' leases", renewed)
            except Exception:
                log.exception("renewing the leases of watching hosts failed; trying again in %.0f s", period)
