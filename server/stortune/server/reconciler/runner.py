"""The Reconciler: the Controller the API hands host names to, run in the app's event loop.

``start`` spawns the workers and the periodic pass; the first pass runs at
once and queues every known host, so a restarted server picks up where the
last one stopped. Each later pass (every ``interval`` seconds) spreads the
hosts evenly over the interval, and every pass expires leases and refreshes
the profiles' status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime

from stortune.schemas import stripecache
from stortune.server.agentclient import AgentClientFactory
from stortune.server.metrics.recorder import Recorder
from stortune.server.reconciler import store
from stortune.server.reconciler.queue import Backoff, WorkQueue
from stortune.server.reconciler.reconcile import Deps, Result, reconcile
from stortune.server.reconciler.summary import summarize
from stortune.server.services.fleet_state import FleetState
from stortune.server.services.versions import VersionReader
from stortune.server.shards import AllShards, Notices, Ownership, shard_of

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


#: Profile summaries take at most this share of the time (a pass re-reads the whole fleet).
SUMMARY_SHARE = 0.05
#: A host whose agent reports its values is still looked at, at the latest after this many
#: intervals (or less often in a fleet too large for ``max_looks_per_s``).
LOOK_INTERVALS = 10


def look_every(hosts: int, interval: float, max_looks_per_s: float) -> float:
    """Seconds between the looks the periodic pass makes at a host whose agent reports its values:
    ten intervals, or longer once a fleet would need more than the budget of looks a second."""
    return max(interval * LOOK_INTERVALS, hosts / max_looks_per_s)


def _spread(name: str) -> float:
    """A host's own fraction in [0.5, 1): its looks come at its own times, not all in one pass."""
    return 0.5 + (zlib.crc32(name.encode()) % 1000) / 2000


def summary_pause(took: float, minimum: float) -> float:
    """Seconds to wait after a summary pass that took ``took``: at least ``minimum``, and long
    enough that passes fill at most SUMMARY_SHARE of the time however large the fleet."""
    return max(minimum, took * (1 - SUMMARY_SHARE) / SUMMARY_SHARE)


class Reconciler:
    """Implements ``stortune.server.controller.Controller``."""

    def __init__(
        self,
        sessions: store.Sessions,
        agents: AgentClientFactory,
        *,
        interval: float = 30.0,
        workers: int = 16,
        clock: Callable[[], datetime] = _utcnow,
        backoff: Callable[[], Backoff] = Backoff,
        summary_delay: float = 1.0,
        versions: VersionReader | None = None,
        ram_share: float = stripecache.DEFAULT_RAM_SHARE,
        metrics: Recorder | None = None,
        ownership: Ownership | None = None,
        notices: Notices | None = None,
        max_looks_per_s: float = 10.0,
        fleet: FleetState | None = None,
    ) -> None:
        self.agents = agents
        self.interval = interval
        self.max_looks_per_s = max_looks_per_s
        #: The app's in-memory fleet index, which the profile summaries count from (None: read them).
        self.fleet = fleet
        self.workers = workers
        self._sessions = sessions
        self._clock = clock
        self._backoff = backoff
        self._summary_delay = summary_delay
        # A reader of its own unless given the app's; closed with the reconciler then.
        self._own_versions = None if versions is not None else VersionReader(sessions)
        self.metrics = metrics or Recorder()
        self.ownership = ownership or AllShards()
        #: Requests for hosts another server owns go there (None: one server owns all).
        self.notices = notices
        self._deps = Deps(sessions, agents, clock, wrote=self._summaries_due,
                          versions=versions or self._own_versions, ram_share=ram_share, metrics=self.metrics,
                          ownership=self.ownership)
        self.ownership.watch(self._shards_changed)
        self._queue: WorkQueue | None = None
        self._summaries: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []
        self._takeovers: set[asyncio.Task[None]] = set()
        #: Called (on the event loop) after host status writes: the rollout driver's wake.
        self.listeners: list[Callable[[], None]] = []

    def enqueue(self, host: str, reason: str) -> None:
        """From any thread; before start() it is dropped (start() queues every host). A host
        another server owns is passed on to it."""
        queue = self._queue
        if queue is None:
            return
        if self.ownership.fence(host) is not None:
            log.debug("queue %s: %s", host, reason)
            queue.add(host)
        elif self.notices is not None:
            self.notices.publish([host])

    def noticed(self, hosts: list[str]) -> None:
        """Hosts another server was asked to reconcile (from any thread): queue the ones owned here."""
        queue = self._queue
        if queue is not None:
            for host in hosts:
                if self.ownership.fence(host) is not None:
                    queue.add(host)

    async def start(self) -> None:
        self._queue = WorkQueue(self._backoff())
        self.metrics.queue_depth_from(self._queue.__len__)
        self._summaries = asyncio.Event()
        self._workers = [asyncio.create_task(self._work(), name=f"reconcile-worker-{i}")
                         for i in range(self.workers)]
        self._loops = [asyncio.create_task(self._periodic(), name="reconcile-resync"),
                       asyncio.create_task(self._summarize_when_due(), name="profile-summaries")]
        log.info("reconciler started: %d workers, every host looked at every %gs",
                 self.workers, self.interval)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking keys, let reconciles in flight finish for ``grace`` seconds, then cancel."""
        if self._queue is None:
            return
        self._queue.shutdown()
        for task in [*self._loops, *self._takeovers]:
            task.cancel()
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=grace)
            for task in pending:
                task.cancel()
        await asyncio.gather(*self._workers, *self._loops, *self._takeovers, return_exceptions=True)
        self._workers, self._loops, self._queue = [], [], None  # requests until the next start are dropped
        if self._own_versions is not None:
            self._own_versions.close()
        close = getattr(self.agents, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()

    async def resync(self, *, spread: bool = True) -> None:
        """Expire leases, then queue every host (drift detection, and whatever a lost request missed).

        With ``spread`` the hosts are queued one after another across the
        interval, in name order, so each is still looked at once per interval,
        but a fleet's drift checks arrive as a steady trickle instead of a
        burst that holds up API requests every interval.

        A host waiting out a retry backoff (or its turn from the last pass) is
        left to it: the pass must not turn a failing host's backoff into one
        attempt per interval. Nor is a host queued again while it is being
        reconciled: that pass reads the state now anyway, and a re-queue would
        retry a failure at once, skipping its backoff. Requests from the API (a
        spec change) still go through at once.
        """
        assert self._queue is not None
        if self.ownership.leads():  # fleet-wide: one server marks lapsed agent leases
            for name in await asyncio.to_thread(store.expire_leases, self._sessions, self._clock()):
                log.warning("%s: lease expired", name)
                self.metrics.lease_expired()
        names = [n for n in await asyncio.to_thread(store.host_names, self._sessions)
                 if self.ownership.fence(n) is not None]
        reported = await asyncio.to_thread(store.reported_digests, self._sessions)
        window = look_every(len(names), self.interval, self.max_looks_per_s)
        now = time.monotonic()
        # Read after the await and used without one: no worker changes them in between.
        backing_off = self._queue.delayed() | self._queue.processing()
        # Hosts whose agents report their values, and last reported what the last quiet look saw,
        # are left until their next paced look: a change on either side asks for one anyway.
        due = [name for name in names if name not in backing_off
               and not self._deps.quiet.settled(name, reported.get(name), now - window * _spread(name))]
        step = self.interval / len(due) if spread and due else 0.0
        for turn, name in enumerate(due):
            self._queue.add_after(name, turn * step)
        self._summaries_due()

    def _shards_changed(self, gained: frozenset[int], _lost: frozenset[int]) -> None:
        """Hosts of shards just taken over are looked at now, not at the next pass."""
        if gained and self._queue is not None:
            task = asyncio.create_task(self._take(gained), name="reconcile-takeover")
            self._takeovers.add(task)
            task.add_done_callback(self._takeovers.discard)

    async def _take(self, shards: frozenset[int]) -> None:
        try:
            names = await asyncio.to_thread(store.host_names, self._sessions)
        except Exception:
            log.exception("reading the hosts of shards taken over failed; the periodic pass queues them")
            return
        for name in names:
            if shard_of(name) in shards:
                self.enqueue(name, "shard taken over")

    def scheduled(self) -> dict[str, float]:
        """Hosts waiting for their turn in the pass or for a retry, and in how many seconds."""
        return {} if self._queue is None else self._queue.delays()

    # -- tasks ------------------------------------------------------------------------
    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while (key := await queue.get()) is not None:
            try:
                result = await reconcile(self._deps, key)
            except Exception:  # a bug or the database: keep the worker, retry the key
                log.exception("reconcile of %s failed", key)
                result = Result.RETRY
            finally:
                queue.done(key)
            if result is Result.RETRY:
                delay = queue.add_rate_limited(key)
                log.debug("%s: retry in %.1fs", key, delay)
            else:
                queue.forget(key)

    async def _periodic(self) -> None:
        first = True
        while True:
            try:
                await self.resync(spread=not first)
                first = False
            except Exception:
                log.exception("periodic pass failed; trying again in %gs", self.interval)
            await asyncio.sleep(self.interval)

    def _summaries_due(self) -> None:
        if self._summaries is not None:
            self._summaries.set()
        for listener in self.listeners:
            listener()

    async def _summarize_when_due(self) -> None:
        assert self._summaries is not None
        while True:
            await self._summaries.wait()
            self._summaries.clear()
            began = time.monotonic()
            try:
                await asyncio.to_thread(self._write_summaries)
            except Exception:
                log.exception("profile summaries failed")
            # A burst of host writes makes one pass; and a pass reads every host, so at 10,000
            # hosts in a rollout one a second took 30 % of the server: pause in proportion.
            await asyncio.sleep(summary_pause(time.monotonic() - began, self._summary_delay))

    def _write_summaries(self) -> None:
        if not self.ownership.leads():  # fleet-wide: one server writes them
            return
        profiles, standings = store.profiles_and_hosts(self._sessions, self.fleet)
        now = self._clock()
        for profile in profiles:
            status = summarize(profile, standings)
            if status != profile.status:
                store.write_profile_status(self._sessions, profile.name, status, now)
