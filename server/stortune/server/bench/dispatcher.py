"""The BenchmarkDispatcher: the run queue's worker, run in the app's event loop.

The queue is the ``benchmark_runs`` table, so it survives restarts. Each pass
(every ``interval`` seconds, and at once when the API adds or cancels a run):

1. fires the schedules that are due (once, however many fire times were missed);
2. asks agents to forget the files of runs whose results are stored (retried
   until acknowledged);
3. per host, takes the run to drive: the one running (a restarted server
   re-attaches to it), else the oldest queued one whose retry time has come.
   Later runs of a host wait: one benchmark at a time per host, in order.
   While a tuning experiment owns a host, only its trials' runs go there;
   the host's other runs wait for the experiment's end (``tune.driver``).

Driving a run: ``StartBenchmark`` under the row's id (the agent ignores a
repeated start of the same id, so a start whose answer was lost, or a server
that died between asking and recording, does no harm); then ``WatchBenchmark``
until the run ends, storing the latest progress at most once a second; then
``GetBenchmarkResult``, whose result and fio's raw files are stored in one
transaction; then ``ForgetBenchmark``.

Failures: a busy agent (another benchmark runs there, perhaps started by
hand) is asked again after an exponential backoff; a refusal (unsafe target,
invalid spec, fio missing) fails the run with the agent's reason; an agent
that does not answer is retried with backoff until ``unreachable_timeout``,
then the run fails with the reason. Cancelling a running run is recorded in
its row (so it survives restarts and reaches the server that follows it) and
sent to the agent, which kills fio and keeps what finished.

Several servers on one database each run a dispatcher, and each drives only
the runs of hosts whose shard it owns (``stortune.server.shards``): every
transaction of a driver is fenced by the host's lease, and a host whose shard
moves away has its driver stopped (the run goes on on its agent; the new owner
re-attaches to it). The schedules fire on one server (they would fire once
anyway: a compare-and-set on the schedule's row).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from stortune.schemas import backoff
from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.server.agentclient import (
    AgentBusy,
    AgentClient,
    AgentClientFactory,
    AgentError,
    AgentNotFound,
    AgentUnreachable,
    BenchmarkProgress,
)
from stortune.server.bench import store
from stortune.server.services.benchmarks import ActiveRun
from stortune.server.shards import AllShards, LeaseLost, Ownership, ensure_held, fenced, moved

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BenchmarkDispatcher:
    """Start it with the app (``start``/``stop``); ``wake`` and ``cancel`` are safe from any thread."""

    def __init__(
        self,
        sessions: store.Sessions,
        agents: AgentClientFactory,
        *,
        clock: Callable[[], datetime] = _utcnow,
        interval: float = 5.0,
        unreachable_timeout: float = 600.0,
        progress_interval: float = 1.0,
        retry_base: float = 2.0,
        retry_cap: float = 120.0,
        ownership: Ownership | None = None,
    ) -> None:
        self.agents = agents
        self.ownership = ownership or AllShards()
        self.ownership.watch(lambda _gained, _lost: self.wake())
        self.interval = interval
        self.unreachable_timeout = unreachable_timeout
        self.progress_interval = progress_interval
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self._sessions = sessions
        self._clock = clock
        self._rng = random.Random()  # noqa: S311 (spreading retries, not secrets)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._main: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None  # forgets stored runs on their agents
        self._drivers: dict[str, asyncio.Task[None]] = {}  # host -> the task driving its run
        self._cancels: dict[str, asyncio.Event] = {}  # run id -> set when a cancel is asked for
        #: Called (in the loop) whenever a host's run stopped being driven: the experiment driver
        #: waits on its trials' runs through this.
        self.listeners: list[Callable[[], None]] = []

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._main = asyncio.create_task(self._run(), name="benchmark-dispatcher")
        log.info("benchmark dispatcher started: queue looked at every %gs", self.interval)

    async def stop(self) -> None:
        """Stop following runs; they go on on their agents and are re-attached at the next start."""
        tasks = [t for t in (self._main, self._sweeper, *self._drivers.values()) if t is not None]
        # Forgotten first, and only this loop's waited for: an app served again on a new loop
        # (tests do) must not hold on to tasks of a loop that is gone.
        self._main, self._sweeper, self._drivers, self._loop = None, None, {}, None
        tasks = [t for t in tasks if t.get_loop() is asyncio.get_running_loop()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def wake(self) -> None:
        """Look at the queue now (a run was added, or a host's run ended)."""
        loop, event = self._loop, self._wakeup
        if loop is None or event is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
            loop.call_soon_threadsafe(event.set)

    def cancel(self, run_id: str) -> None:
        """A cancel of ``run_id`` was stored: tell its agent now if this server follows the run."""
        loop = self._loop
        if loop is None:
            return

        def signal() -> None:
            event = self._cancels.get(run_id)
            if event is not None:
                event.set()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(signal)

    # -- the passes ------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            try:
                await self.pass_once()
            except Exception:  # the database, or a bug: the next pass tries again
                log.exception("benchmark dispatch pass failed; again in %gs", self.interval)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when the
            # event is set in the same tick as a cancel (a driver ending as stop() cancels it),
            # swallowing the cancel and leaving stop() waiting for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wakeup.wait()
            self._wakeup.clear()

    async def pass_once(self) -> None:
        now = self._clock()
        if self.ownership.leads():
            for name, count in await asyncio.to_thread(store.fire_due_schedules, self._sessions, now):
                log.info("schedule %s fired: %d run(s) queued", name, count)
        for host in moved(self.ownership, self._drivers):  # the new owner follows the run
            log.info("benchmark runs on %s are followed by another server now", host)
        # Stored runs are forgotten on their agents beside the passes: a dead agent must not slow them.
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._forget_held(), name="benchmark-forget")
        runs, owners = await asyncio.to_thread(store.active_runs, self._sessions)
        by_host: dict[str, list[ActiveRun]] = {}
        for run in runs:
            # An experiment owns the host: only its trials run there meanwhile (None: only others).
            if run.experiment == owners.get(run.host) or run.state == "running":
                by_host.setdefault(run.host, []).append(run)
        now = self._clock()
        for host, queue in by_host.items():
            fence = self.ownership.fence(host)
            if host in self._drivers or fence is None:
                continue
            running = next((r for r in queue if r.state == "running"), None)
            head = running or queue[0]  # in queue order: a host's later runs wait for the first
            if head.state == "queued" and head.not_before is not None and head.not_before > now:
                continue
            with fenced(fence):  # the task gets a copy of this context: all its transactions are fenced
                task = asyncio.create_task(self._drive(head), name=f"benchmark-{head.id}")
            self._drivers[host] = task
            task.add_done_callback(self._driven_callback(host))

    def _driven_callback(self, host: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._driven(host)

    def _driven(self, host: str) -> None:
        self._drivers.pop(host, None)
        if self._wakeup is not None:
            self._wakeup.set()  # the host's next run may go
        for listener in self.listeners:
            listener()

    async def _forget_held(self) -> None:
        failing: set[str] = set()  # agents that did not forget now: a later pass tries again
        try:
            for run_id, host, address in await asyncio.to_thread(store.held, self._sessions):
                if host in self._drivers or address in failing or self.ownership.fence(host) is None:
                    continue  # a driver forgets its own run when it ends; another server its hosts' runs
                if not await self._forget(self.agents.for_address(address, host), run_id):
                    failing.add(address)
        except Exception:
            log.exception("forgetting stored benchmark runs on their agents failed; a later pass retries")

    async def _forget(self, agent: AgentClient, run_id: str) -> bool:
        try:
            await agent.forget_benchmark(run_id)
        except AgentNotFound:
            pass
        except AgentError as exc:
            log.info("benchmark %s: the agent keeps its files for now: %s", run_id, exc.message)
            return False
        await asyncio.to_thread(store.forgotten, self._sessions, run_id)
        return True

    # -- driving one run ---------------------------------------------------------------------
    def _delay(self, attempts: int) -> float:
        return backoff.shortened(attempts, self.retry_base, self.retry_cap, 0.2, self._rng.random())

    async def _drive(self, run: ActiveRun) -> None:
        try:
            target = await asyncio.to_thread(store.host_target, self._sessions, run.host)
            if target is None:
                await asyncio.to_thread(store.fail, self._sessions, run.id,
                                        f"host {run.host} is not registered any more", self._clock())
                return
            address, applied = target
            agent = self.agents.for_address(address, run.host)
            if run.state == "queued" and not await self._start(agent, address, run, applied):
                return
            await self._follow(agent, address, run)
        except asyncio.CancelledError:
            raise
        except LeaseLost as exc:
            log.info("benchmark %s: %s; its new owner follows the run", run.id, exc)
        except Exception:
            log.exception("benchmark %s on %s: driving it failed; trying again in %gs", run.id, run.host,
                          self.interval)
            await asyncio.sleep(self.interval)  # keep the host's slot meanwhile: no tight retry loop

    async def _start(self, agent: AgentClient, address: str, run: ActiveRun, applied: dict[str, int]) -> bool:
        """Hand the run to its agent; False when it is not running there (deferred, failed, cancelled)."""
        spec = BenchmarkSpec.model_validate(run.spec)
        ensure_held(self.ownership)
        try:
            progress = await agent.start_benchmark(run.id, spec)
        except AgentBusy as exc:
            await self._defer(run, f"waiting: {exc.message}", unreachable_since=None)
            return False
        except AgentUnreachable as exc:
            since = run.unreachable_since or self._clock()
            why = f"agent at {address} unreachable since {since.isoformat(timespec='seconds')}: {exc.reason}"
            if self._clock() - since >= timedelta(seconds=self.unreachable_timeout):
                await asyncio.to_thread(store.fail, self._sessions, run.id, f"not started: {why}",
                                        self._clock())
            else:
                await self._defer(run, f"waiting: {why}", unreachable_since=since)
            return False
        except AgentError as exc:
            if exc.retryable:
                await self._defer(run, f"waiting: {exc.message}", unreachable_since=None)
            else:
                log.warning("benchmark %s on %s refused: %s", run.id, run.host, exc.message)
                await asyncio.to_thread(store.fail, self._sessions, run.id,
                                        f"refused by the agent: {exc.message}", self._clock())
            return False
        if await asyncio.to_thread(store.mark_running, self._sessions, run.id, progress, applied,
                                   self._clock()):
            log.info("benchmark %s (%s) started on %s", run.id, spec.name, run.host)
            return True
        # Cancelled while the start was on its way: stop it there; the forget sweep cleans up.
        with contextlib.suppress(AgentError):
            await agent.cancel_benchmark(run.id)
        await asyncio.to_thread(store.hold, self._sessions, run.id)
        return False

    async def _defer(self, run: ActiveRun, why: str, *, unreachable_since: datetime | None) -> None:
        delay = self._delay(run.attempts)
        now = self._clock()
        await asyncio.to_thread(
            store.postpone, self._sessions, run.id, message=f"{why}; next try in {delay:.0f}s",
            not_before=now + timedelta(seconds=delay), unreachable_since=unreachable_since, now=now)

    async def _follow(self, agent: AgentClient, address: str, run: ActiveRun) -> None:
        cancel = self._cancels.setdefault(run.id, asyncio.Event())
        if run.cancel_requested:
            cancel.set()
        canceller = asyncio.create_task(self._send_cancel(agent, run.id, cancel))
        try:
            await self._watch_until_done(agent, address, run, cancel)
        finally:
            canceller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await canceller
            self._cancels.pop(run.id, None)

    async def _watch_until_done(self, agent: AgentClient, address: str, run: ActiveRun,
                                cancel: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        unreachable_since = run.unreachable_since
        failures = 0
        while True:
            try:
                last_write = -self.progress_interval
                last_message: str | None = None
                async for progress in agent.watch_benchmark(run.id):
                    unreachable_since, failures = None, 0
                    if progress.finished:
                        break
                    due = loop.time() - last_write >= self.progress_interval
                    if due or progress.message != last_message:
                        last_write, last_message = loop.time(), progress.message
                        asked = await self._progress(run.id, progress)
                        if asked is None:
                            return  # the row ended under us (cancelled before start, or another server)
                        if asked:
                            cancel.set()
                outcome = await agent.get_benchmark_result(run.id)
            except AgentNotFound as exc:
                await asyncio.to_thread(store.fail, self._sessions, run.id,
                                        f"the agent at {address} no longer has this run: {exc.message}",
                                        self._clock())
                return
            except AgentError as exc:
                if not exc.retryable:
                    await asyncio.to_thread(store.fail, self._sessions, run.id,
                                            f"following the run failed: {exc.message}", self._clock())
                    return
                now = self._clock()
                if await asyncio.to_thread(store.host_target, self._sessions, run.host) is None:
                    # Deleted: nothing would dial its agent any more but this loop.
                    await asyncio.to_thread(store.fail, self._sessions, run.id,
                                            f"host {run.host} was deleted while its agent at {address} "
                                            f"did not answer: {exc.message}", now)
                    return
                unreachable_since = unreachable_since or now
                why = (f"agent at {address} unreachable since "
                       f"{unreachable_since.isoformat(timespec='seconds')}: {exc.message}")
                if now - unreachable_since >= timedelta(seconds=self.unreachable_timeout):
                    await asyncio.to_thread(store.fail, self._sessions, run.id, why, now)
                    return
                await asyncio.to_thread(store.note, self._sessions, run.id, message=why,
                                        unreachable_since=unreachable_since, now=now)
                log.info("benchmark %s on %s: %s; following it again shortly", run.id, run.host, why)
                await asyncio.sleep(self._delay(failures))
                failures += 1
                continue
            if outcome.progress.finished:
                if await asyncio.to_thread(store.conclude, self._sessions, run.id, outcome, self._clock()):
                    log.info("benchmark %s on %s ended: %s %s", run.id, run.host, outcome.progress.state,
                             outcome.progress.message)
                await self._forget(agent, run.id)
                return
            # The stream ended before the run did (the agent is restarting): look again shortly.
            if await self._progress(run.id, outcome.progress) is None:
                return
            await asyncio.sleep(min(self.interval, 2.0))

    async def _progress(self, run_id: str, progress: BenchmarkProgress) -> bool | None:
        return await asyncio.to_thread(store.write_progress, self._sessions, run_id, progress, self._clock())

    async def _send_cancel(self, agent: AgentClient, run_id: str, asked: asyncio.Event) -> None:
        await asked.wait()
        failures = 0
        while True:
            try:
                await agent.cancel_benchmark(run_id)
                log.info("benchmark %s: cancel sent to the agent", run_id)
                return
            except AgentNotFound:
                return
            except AgentError as exc:
                if not exc.retryable:
                    log.warning("benchmark %s: the agent refused the cancel: %s", run_id, exc.message)
                    return
            await asyncio.sleep(self._delay(failures))
            failures += 1
