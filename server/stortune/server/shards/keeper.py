"""``ShardKeeper``: this server's leases on its share of the shards, in PostgreSQL.

Every ``lease_s / 3`` seconds, in one short transaction: the server's heartbeat in
``replicas``, the renewal of the leases it holds (a lease that ran out is not renewed:
it is lost, and may be claimed again under a new generation), the count of live servers
(a heartbeat younger than ``lease_s``) and from it the fair share, ``ceil(SHARDS / live)``.
Below its share a server claims free or expired shards (``FOR UPDATE SKIP LOCKED``, so
servers claiming at once take different ones); above it, it gives the extra ones up.

A server trusts its leases for two thirds of ``lease_s`` after the start of the last
renewal that succeeded, while the database keeps them a full ``lease_s``: a server cut off
from the database stops working on its hosts before another may take them. A server
that dies gives its shards up when their leases run out (``lease_s``); the others take
them at their next renewal. Giving a shard up (a new server came, or this one stops) first
stops new work on it, tells the listeners (benchmark and experiment drivers let the
host's work go), waits a little for reconciles in flight and then frees the row.

Times are the database's (``now()``), so servers' clocks need not agree.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, event, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker
from sqlalchemy.types import Integer

from stortune.server.metrics.recorder import Recorder
from stortune.server.shards.ownership import SHARDS, Fence, LeaseLost, Listener, current_fence, shard_of

log = logging.getLogger(__name__)

_SEED = text("INSERT INTO shard_leases (shard, owner, generation, expires_at)"
             " SELECT s, NULL, 0, now() FROM generate_series(0, :last) AS s ON CONFLICT (shard) DO NOTHING")
_HEARTBEAT = text("INSERT INTO replicas (id, started_at, heartbeat_at) VALUES (:me, now(), now())"
                  " ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()")
_RENEW = text("UPDATE shard_leases SET expires_at = now() + make_interval(secs => :ttl)"
              " WHERE owner = :me AND expires_at > now() RETURNING shard, generation")
_LIVE = text("SELECT count(*) FROM replicas WHERE heartbeat_at > now() - make_interval(secs => :ttl)")
_FORGET_DEAD = text("DELETE FROM replicas WHERE heartbeat_at < now() - make_interval(secs => :ttl * 10)")
_CLAIM = text("UPDATE shard_leases SET owner = :me, generation = generation + 1,"
              " expires_at = now() + make_interval(secs => :ttl)"
              " WHERE shard IN (SELECT shard FROM shard_leases WHERE owner IS NULL OR expires_at <= now()"
              " ORDER BY shard LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING shard, generation")
_GIVE_UP = text("UPDATE shard_leases SET owner = NULL, expires_at = now()"
                " WHERE owner = :me AND shard = ANY(:shards)").bindparams(
    bindparam("shards", type_=ARRAY(Integer)))
_LEAVE = text("DELETE FROM replicas WHERE id = :me")
# FOR KEY SHARE, not FOR SHARE: it conflicts with the claim's FOR UPDATE (a takeover skips the
# row while a fenced transaction is open) but not with the FOR NO KEY UPDATE of this server's own
# renewal and give-up, which must never wait for a fenced transaction (that one may itself wait on
# the resourceVersion row behind any slow API write; the blocked renewal would then hold row locks
# on this server's other shards, so nobody could claim them and a new server could not even seed).
_GUARD = text("SELECT 1 FROM shard_leases WHERE shard = :shard AND owner = :owner"
              " AND generation = :generation AND expires_at > now() FOR KEY SHARE")


def replica_name() -> str:
    return f"{socket.gethostname()[:80]}-{os.getpid()}-{secrets.token_hex(3)}"


class ShardKeeper:
    """``Ownership`` across the servers of one PostgreSQL database."""

    def __init__(self, engine: Engine, *, lease_s: float = 15.0, replica: str | None = None,
                 metrics: Recorder | None = None, renew_every: float | None = None) -> None:
        self.replica = replica or replica_name()
        self.lease_s = lease_s
        self.renew_every = renew_every or lease_s / 3
        self.metrics = metrics or Recorder()
        self._engine = engine
        # shard -> the generation it is held under. Replaced, never changed in place: API threads
        # and the metrics scrape read it while the event loop renews.
        self._owned: dict[int, int] = {}
        self._valid_until = 0.0  # time.monotonic(): the leases are trusted until then
        self._listeners: list[Listener] = []
        self._inflight: Counter[int] = Counter()
        self._task: asyncio.Task[None] | None = None
        # A thread of its own: the default executor (min(32, cores + 4) threads) is shared with every
        # reconcile worker and driver, whose database calls must not delay a renewal.
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None  # from start() to stop()
        self.metrics.shards_owned_from(lambda: len(self.owned()))

    # -- Ownership ----------------------------------------------------------------------
    def owned(self) -> frozenset[int]:
        return frozenset(self._owned) if time.monotonic() < self._valid_until else frozenset()

    def fence(self, host: str) -> Fence | None:
        shard = shard_of(host)
        generation = self._owned.get(shard)
        if generation is None or time.monotonic() >= self._valid_until:
            return None
        return Fence(host, shard, self.replica, generation)

    def holds(self, fence: Fence) -> bool:
        return self._owned.get(fence.shard) == fence.generation and time.monotonic() < self._valid_until

    def leads(self) -> bool:
        return 0 in self.owned()

    def watch(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def install(self, sessions: sessionmaker[Session]) -> None:
        event.listen(sessions, "after_begin", _guard)

    @contextlib.contextmanager
    def working(self, fence: Fence) -> Iterator[None]:
        self._inflight[fence.shard] += 1
        try:
            yield
        finally:
            self._inflight[fence.shard] -= 1

    # -- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stortune-shards")
        await self._db(_seed)
        await self.tick()
        self._task = asyncio.create_task(self._keep(), name="shard-keeper")
        log.info("replica %s: %d of %d shards", self.replica, len(self._owned), SHARDS)

    async def stop(self) -> None:
        """Give every shard up at once (the others take them at their next renewal)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self._give_up(sorted(self._owned))
            await self._db(_leave)
        except Exception:  # the database is gone: the leases run out by themselves
            log.exception("replica %s: giving the shards up failed", self.replica)
        self._valid_until = 0.0
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    async def _keep(self) -> None:
        # At a fixed rate from the start of each tick, not renew_every after its end: a tick that
        # waited for reconciles in flight (giving shards up) or for a slow database must not push
        # the next renewal past the trust window (2 renewal periods). A failed renewal is retried
        # soon, not a whole period later, so one failure does not cost every shard's trust.
        next_at = time.monotonic() + self.renew_every
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            began = time.monotonic()
            try:
                await self.tick()
                next_at = began + self.renew_every
            except Exception:
                log.exception("replica %s: renewing the shard leases failed; trusted for %.1fs more",
                              self.replica, max(0.0, self._valid_until - time.monotonic()))
                next_at = time.monotonic() + min(1.0, self.renew_every / 4)

    async def tick(self) -> None:
        """One renewal; then claim up to the fair share, or give the extra shards up."""
        began = time.monotonic()
        renewed, live = await self._db(_renew)
        lapsed = began >= self._valid_until  # work on these hosts was refused meanwhile
        was = self._owned
        self._owned = dict(renewed)
        self._valid_until = began + self.lease_s * 2 / 3
        lost = frozenset(s for s, g in was.items() if self._owned.get(s) != g)
        share = math.ceil(SHARDS / max(1, live))
        # Trusted again after a lapse: requests dropped meanwhile are looked at now (takeover path).
        gained: frozenset[int] = frozenset(self._owned) if lapsed and was else frozenset()
        if len(self._owned) < share:
            claimed = await self._db(_claim, share - len(self._owned))
            self._owned = {**self._owned, **claimed}
            gained = gained | frozenset(claimed)
        if lost or gained:
            if lost:
                log.warning("replica %s lost shards %s", self.replica, sorted(lost))
            self.metrics.shard_changes("gained", len(gained))
            self.metrics.shard_changes("lost", len(lost))
            self._tell(gained, lost)
        if len(self._owned) > share:
            await self._give_up(sorted(self._owned)[share:])

    async def _give_up(self, shards: list[int]) -> None:
        if not shards:
            return
        self._owned = {s: g for s, g in self._owned.items() if s not in shards}
        self._tell(frozenset(), frozenset(shards))
        # Half a renewal period at most: this runs inside a tick, before the next renewal.
        deadline = time.monotonic() + self.renew_every / 2
        while any(self._inflight[s] for s in shards) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self._db(_give_up, shards)
        self.metrics.shard_changes("released", len(shards))
        log.info("replica %s gave up shards %s", self.replica, shards)

    def _tell(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        for listener in self._listeners:
            try:
                listener(gained, lost)
            except Exception:
                log.exception("a shard listener failed")

    # -- SQL ----------------------------------------------------------------------------
    async def _db(self, step: Any, *args: Any) -> Any:
        if self._thread is None:  # ticked without start() (tests drive keepers step by step)
            return await asyncio.to_thread(self._run, step, *args)
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, step, *args)

    def _run(self, step: Any, *args: Any) -> Any:
        with self._engine.begin() as conn:
            # Never wait on a row lock or a slow statement past a renewal period: fail, retry soon.
            ms = max(100, int(self.renew_every * 1000 / 2))
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")
            return step(conn, self, *args)


def _seed(conn: Connection, keeper: ShardKeeper) -> None:
    conn.execute(_SEED, {"last": SHARDS - 1})


def _renew(conn: Connection, keeper: ShardKeeper) -> tuple[list[tuple[int, int]], int]:
    ttl = {"me": keeper.replica, "ttl": keeper.lease_s}
    conn.execute(_HEARTBEAT, ttl)
    renewed = [(int(s), int(g)) for s, g in conn.execute(_RENEW, ttl)]
    live = int(conn.execute(_LIVE, ttl).scalar_one())
    conn.execute(_FORGET_DEAD, ttl)
    return renewed, live


def _claim(conn: Connection, keeper: ShardKeeper, n: int) -> dict[int, int]:
    rows = conn.execute(_CLAIM, {"me": keeper.replica, "ttl": keeper.lease_s, "n": n})
    return {int(s): int(g) for s, g in rows}


def _give_up(conn: Connection, keeper: ShardKeeper, shards: list[int]) -> None:
    conn.execute(_GIVE_UP, {"me": keeper.replica, "shards": shards})


def _leave(conn: Connection, keeper: ShardKeeper) -> None:
    conn.execute(_LEAVE, {"me": keeper.replica})


def _guard(session: Session, _transaction: SessionTransaction, connection: Connection) -> None:
    """A transaction begun inside ``fenced``: its lease must still hold (and is held shared)."""
    fence = current_fence()
    if fence is None:
        return
    held = connection.execute(_GUARD, {"shard": fence.shard, "owner": fence.owner,
                                       "generation": fence.generation}).first()
    if held is None:
        raise LeaseLost(fence)
