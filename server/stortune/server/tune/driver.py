"""The ExperimentDriver: runs tuning experiments, one trial at a time per host, in the app's event loop.

The queue is the ``experiments``/``experiment_hosts``/``experiment_trials`` rows, so it
survives restarts. Each pass (every ``interval`` seconds, and at once when the API adds or
cancels an experiment) takes, per host, the oldest experiment that has not ended there and
drives it; later experiments of a host wait, as later benchmarks do.

Driving one host of one experiment:

1. **Claim.** Read the host's topology from its agent, find the target device (exactly one),
   note the values in effect (the baseline point) and the desired profiles, and claim the
   host unless a benchmark runs there. From then on the reconciler holds off the host
   (``Applied=False ExperimentRunning``) and the benchmark queue runs only this
   experiment's trials on it.
2. **Trials.** The engine (``stortune.schemas.tuning.engine``) is rebuilt from the trials
   recorded so far, so a restarted server asks for the same next trial. Per trial: Apply the
   desired profiles plus the overlay profile that sets the trial's values (transactional and
   journaled on the agent); queue the trial's benchmark run under a deterministic id
   (``<experiment>-h<host>-t<index>``) in the same transaction as the trial's row, which is
   unique per (experiment, host, index): a restarted server finds the row and follows the
   run the benchmark queue re-attached to, so nothing runs twice and nothing is lost; when
   the run ends, measure it, check the trial's values were really in effect, and record the
   measurement with the host's evidence in one transaction. The overlay names the device by
   stable id, and a run whose target has another id (fio read another device than the one
   tuned) stops the experiment: one evidence set never mixes two devices.
3. **End** (done, budget, cancel, failure): Apply the host's desired profiles without the
   overlay (with the recommended profile when ``applyResult``), retried until it succeeds;
   then release the host: the reconciler enforces its desired state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stortune.schemas import backoff, stripecache
from stortune.schemas.bench.results import TERMINAL_STATES, BenchmarkResult
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device
from stortune.schemas.tuning.experiment import TuningExperiment, check_against_device, parse_experiment
from stortune.schemas.tuning.overlay import other_device, overlay_conflicts, overlay_profile, shared_ids
from stortune.schemas.tuning.space import Measurement, TrialRequest, benchmark_for, failed, measure
from stortune.schemas.tuning.timing import DEADLINE, search_elapsed
from stortune.server.agentclient import (
    AgentBusy,
    AgentClient,
    AgentClientFactory,
    AgentError,
    AgentUnreachable,
)
from stortune.server.bench.dispatcher import BenchmarkDispatcher
from stortune.server.services.experiments import ActiveHost, beneath_of, find_target, trial_run_id
from stortune.server.shards import AllShards, LeaseLost, Ownership, ensure_held, fenced, moved
from stortune.server.tune import evidence, results, store

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _read_id(result: BenchmarkResult) -> str | None:
    """The stable id of the device the run's fio read (None: the run does not say)."""
    return result.context.target.device_id if result.context is not None else None


class HostFailed(Exception):
    """The host cannot go on with the experiment (gone, unreachable too long, refused)."""


class Cancelled(Exception):
    """The experiment was cancelled while the driver waited on its agent."""


class DeadlinePassed(Exception):
    """budget.duration ran out while the driver waited on its agent."""


@dataclass
class _Held:
    """What the driver keeps about a host it owns for an experiment."""

    exp: TuningExperiment
    active: ActiveHost
    agent: AgentClient
    device: Device
    beneath: list[Device]
    baseline: dict[str, Any]
    profiles: list[StorageProfile]
    generations: dict[str, int]
    members: int = 1


class ExperimentDriver:
    """Start it with the app (``start``/``stop``); ``wake`` is safe from any thread."""

    def __init__(
        self,
        sessions: store.Sessions,
        agents: AgentClientFactory,
        benchmarks: BenchmarkDispatcher,
        *,
        clock: Callable[[], datetime] = _utcnow,
        interval: float = 5.0,
        unreachable_timeout: float = 600.0,
        retry_base: float = 1.0,
        retry_cap: float = 60.0,
        poll: float = 1.0,
        ownership: Ownership | None = None,
        ram_share: float = stripecache.DEFAULT_RAM_SHARE,
    ) -> None:
        self.agents = agents
        #: Sent with every apply (Settings.stripe_cache_ram_share): the agent holds trials to it too.
        self.ram_share = ram_share
        #: Only hosts of shards this server owns are driven here; each driver's transactions are fenced.
        self.ownership = ownership or AllShards()
        self.ownership.watch(lambda _gained, _lost: self.wake())
        self.benchmarks = benchmarks
        self.interval = interval
        self.unreachable_timeout = unreachable_timeout
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.poll = poll
        self._sessions = sessions
        self._clock = clock
        self._rng = random.Random()  # noqa: S311 (spreading retries, not secrets)
        self._wakeup: asyncio.Event | None = None
        self._runs: asyncio.Event | None = None  # set when the benchmark queue ended a host's run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._drivers: dict[str, asyncio.Task[None]] = {}  # host -> the task driving its experiment

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup, self._runs = asyncio.Event(), asyncio.Event()
        self.benchmarks.listeners.append(self._run_ended)
        self._main = asyncio.create_task(self._run(), name="experiment-driver")
        log.info("experiment driver started: queue looked at every %gs", self.interval)

    async def stop(self) -> None:
        """Stop driving; the trials' runs go on on their agents and are followed again at the next start."""
        with contextlib.suppress(ValueError):
            self.benchmarks.listeners.remove(self._run_ended)
        tasks = [t for t in (self._main, *self._drivers.values()) if t is not None]
        self._main, self._drivers, self._loop = None, {}, None  # first: see BenchmarkDispatcher.stop
        tasks = [t for t in tasks if t.get_loop() is asyncio.get_running_loop()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def wake(self) -> None:
        """Look at the queue now (an experiment was added or cancelled)."""
        loop, event, runs = self._loop, self._wakeup, self._runs
        if loop is None or event is None or runs is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
            loop.call_soon_threadsafe(event.set)
            loop.call_soon_threadsafe(runs.set)  # a driver waiting on a run looks at its cancel now

    def _run_ended(self) -> None:
        if self._runs is not None:
            self._runs.set()

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            try:
                await self.pass_once()
            except Exception:  # the database, or a bug: the next pass tries again
                log.exception("experiment pass failed; again in %gs", self.interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wakeup.wait()
            self._wakeup.clear()

    async def pass_once(self) -> None:
        for host in moved(self.ownership, self._drivers):  # the new owner resumes from the rows
            log.info("the experiment on %s is driven by another server now", host)
        seen: set[str] = set()
        for active in await asyncio.to_thread(store.active_hosts, self._sessions):
            if active.host in seen:
                continue  # a later experiment of this host waits for the earlier one
            seen.add(active.host)
            fence = self.ownership.fence(active.host)
            if active.host in self._drivers or fence is None:
                continue
            with fenced(fence):  # the task's copy of the context carries the fence
                task = asyncio.create_task(self._drive(active),
                                           name=f"experiment-{active.experiment}-{active.host}")
            self._drivers[active.host] = task
            task.add_done_callback(self._driven_callback(active.host))

    def _driven_callback(self, host: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._driven(host)

    def _driven(self, host: str) -> None:
        self._drivers.pop(host, None)
        if self._wakeup is not None:
            self._wakeup.set()  # the host's next experiment may go

    # -- one host ----------------------------------------------------------------------------
    def _delay(self, attempts: int) -> float:
        return backoff.shortened(attempts, self.retry_base, self.retry_cap, 0.2, self._rng.random())

    async def _note(self, active: ActiveHost, message: str) -> None:
        await asyncio.to_thread(store.note, self._sessions, active.experiment, active.host, message,
                                self._clock())

    async def _wait(self, active: ActiveHost, message: str) -> None:
        """Say why the host is not taken yet, and keep its slot a while: no tight retry loop."""
        await self._note(active, message)
        await asyncio.sleep(self.interval)

    async def _drive(self, active: ActiveHost) -> None:
        try:
            exp = parse_experiment(active.document)
            if active.state == "queued":
                if active.cancel_requested:
                    await self._release(active, None, "cancelled", "cancelled before the host was taken")
                    return
                held = await self._claim(exp, active)
                if held is None:
                    return  # waits (a benchmark runs there) or ended (failed before anything changed)
            else:
                held = await self._resume(exp, active)
            state, why = "done", ""
            try:
                why = await self._trials(held)
            except HostFailed as exc:
                state, why = "failed", str(exc)
            if why == "cancelled":
                state = "cancelled"
            await self._end(held, state, why)
        except asyncio.CancelledError:
            raise
        except LeaseLost as exc:
            log.info("experiment %s: %s; its new owner resumes it", active.experiment, exc)
        except Exception:
            log.exception("experiment %s on %s: driving it failed; trying again in %gs", active.experiment,
                          active.host, self.interval)
            await asyncio.sleep(self.interval)  # keep the host's slot meanwhile: no tight retry loop

    async def _agent(self, active: ActiveHost) -> AgentClient:
        address = await asyncio.to_thread(store.host_address, self._sessions, active.host)
        if address is None:
            raise HostFailed(f"host {active.host} is not registered any more")
        return self.agents.for_address(address, active.host)

    async def _desired(self, active: ActiveHost) -> tuple[list[StorageProfile], dict[str, int]]:
        view = await asyncio.to_thread(store.host_view, self._sessions, active.host)
        if view is None:
            raise HostFailed(f"host {active.host} is not registered any more")
        if view.invalid:
            raise HostFailed("profiles selecting the host are not valid now: " + "; ".join(
                f"{n}: {w}" for n, w in sorted(view.invalid.items())))
        return list(view.profiles), view.generations()

    async def _claim(self, exp: TuningExperiment, active: ActiveHost) -> _Held | None:
        try:
            agent = await self._agent(active)
            running = await asyncio.to_thread(store.busy_with_benchmark, self._sessions, active.host)
            if running is not None:
                await self._wait(active, f"waiting: benchmark {running} runs on the host")
                return None
            try:
                _, topology, _ = await agent.get_topology()
            except AgentError as exc:
                await self._wait(active, f"waiting: the agent does not answer: {exc.message}")
                return None
            device, why = find_target(exp, topology)
            if device is None:
                raise HostFailed(f"spec.target.device {why}")
            beneath = beneath_of(topology, device)
            shared = shared_ids(topology, [device, *beneath])
            if shared:  # the overlay names devices by id: one id must be one device
                raise HostFailed("the trial's values would reach other devices too: " + "; ".join(shared))
            problems = check_against_device(exp, device, beneath)
            if problems:
                raise HostFailed("; ".join(f"{p.path}: {p.message}" for p in problems))
            try:
                baseline, settings, owned = results.baseline_of(exp, device, beneath)
            except ValueError as exc:
                raise HostFailed(f"no baseline: {exc}") from None
            profiles, generations = await self._desired(active)
            conflicts = overlay_conflicts(overlay_profile(exp.name, baseline, device, beneath), profiles)
            if conflicts:
                raise HostFailed(f"profiles {', '.join(conflicts)} have the top priority the experiment's "
                                 "overlay needs: its trials would measure their values, not its own")
        except HostFailed as exc:
            await self._release(active, None, "failed", str(exc))
            return None
        originals = {"settings": settings, "owned": owned, "device": device.model_dump(mode="json"),
                     "beneath": [d.model_dump(mode="json") for d in beneath],
                     "profiles": [p.model_dump(mode="json", by_alias=True, exclude_none=True)
                                  for p in profiles],
                     "generations": generations}
        if not await asyncio.to_thread(store.claim, self._sessions, active.experiment, active.host,
                                       device=device.name, baseline=baseline, originals=originals,
                                       now=self._clock()):
            await self._wait(active, "waiting: the host is busy (a benchmark or another experiment)")
            return None
        log.info("experiment %s took %s (device %s, baseline %s)", active.experiment, active.host,
                 device.name, baseline)
        return _Held(exp, active, agent, device, beneath, baseline, profiles, generations,
                     evidence.members_of(originals))

    async def _resume(self, exp: TuningExperiment, active: ActiveHost) -> _Held:
        """A host this experiment owns already (a restarted server): as it was claimed."""
        row = await asyncio.to_thread(store.host_row, self._sessions, active.experiment, active.host)
        assert row is not None and row.originals is not None and row.baseline is not None
        agent = await self._agent(active)
        originals = row.originals
        return _Held(exp, active, agent, Device.model_validate(originals["device"]),
                     [Device.model_validate(d) for d in originals["beneath"]], dict(row.baseline),
                     [StorageProfile.model_validate(p) for p in originals["profiles"]],
                     dict(originals["generations"]), evidence.members_of(originals))

    # -- trials ------------------------------------------------------------------------------
    async def _trials(self, held: _Held) -> str:
        """Run trials until the engine is finished or the experiment is cancelled; -> why it ended."""
        active = held.active
        if active.state == "restoring":
            return "restoring"
        rows = await asyncio.to_thread(store.trials, self._sessions, active.experiment, active.host)
        history = [Measurement.model_validate(r.measurement) for r in rows
                   if r.state in ("done", "failed") and r.measurement is not None]
        engine = evidence.engine_for(held.exp, held.baseline, history, active.seed, held.members)
        started = active.started_at or self._clock()
        deadline = results.deadline_of(held.exp, started)
        pending = next((r for r in rows if r.state in ("queued", "running")), None)
        while True:
            # A trial in flight is followed to its end first: _wait_run stops it when cancelled.
            if pending is None and await asyncio.to_thread(store.cancel_requested, self._sessions,
                                                           active.experiment):
                return "cancelled"
            if pending is None and self._clock() >= deadline:
                return DEADLINE
            if pending is not None:  # a trial a restarted server finds in flight: follow its run
                request = TrialRequest(index=pending.index, point=dict(pending.point),
                                       purpose=pending.purpose,
                                       total_estimate=max(engine.progress().total_estimate,
                                                          pending.index + 1),
                                       reason="in flight when the control plane restarted")
                run_id, pending = pending.run_id, None
            else:
                elapsed = (self._clock() - started).total_seconds()
                next_request = engine.next(elapsed_s=search_elapsed(
                    held.exp.spec, elapsed, len(engine.measurements)))
                if next_request is None:
                    return engine.finished_reason or "done"
                request = next_request
                run_id = trial_run_id(active.experiment, active.host_index, request.index)
                try:
                    refused = await self._set_values(held, request, run_id, deadline)
                except Cancelled:
                    return "cancelled"
                except DeadlinePassed:
                    return DEADLINE
                if refused is not None:
                    await self._record(held, engine, failed(request, refused, active.host, run_id),
                                       ran=False)
                    continue
                spec = benchmark_for(held.exp, run_id)
                await asyncio.to_thread(store.open_trial, self._sessions, active.experiment, active.host,
                                        index=request.index, point=request.point, purpose=request.purpose,
                                        run_id=run_id, spec=spec,
                                        progress=evidence.progress_doc(engine, request), now=self._clock())
                self.benchmarks.wake()
            result, message = await self._wait_run(run_id, deadline)
            if result is None:
                measured = failed(request, message, active.host, run_id)
            elif moved := other_device(held.device, _read_id(result)):
                # One evidence set must not mix two devices: the experiment stops, the host goes back.
                await self._record(held, engine, failed(request, moved, active.host, run_id))
                raise HostFailed(moved)
            else:
                measured = measure(result, held.exp, request, active.host)
                wrong = results.values_not_in_effect(result, request.point, held.device, held.beneath)
                if measured.ok and wrong:
                    measured = measured.model_copy(update={
                        "ok": False, "message": f"the trial's values were not in effect ({wrong}): "
                                                "not counted"})
            await self._record(held, engine, measured)

    async def _record(self, held: _Held, engine: evidence.Engine, measured: Measurement, *,
                      ran: bool = True) -> None:
        """The measurement into the engine and, with the host's evidence, into the trial's row
        (made here for a trial that never ran: its values were refused)."""
        engine.record(measured)
        active = held.active
        outcome, progress = evidence.outcome_doc(engine), evidence.progress_doc(engine, None, measured)
        if ran:
            await asyncio.to_thread(
                store.record_trial, self._sessions, active.experiment, active.host, measured.index,
                ok=measured.ok, measurement=measured.model_dump(mode="json"), message=measured.message,
                outcome=outcome, progress=progress, now=self._clock())
        else:
            await asyncio.to_thread(
                store.refused_trial, self._sessions, active.experiment, active.host, measured.index,
                point=measured.point, purpose=measured.purpose, run_id=measured.run_id or "",
                measurement=measured.model_dump(mode="json"), message=measured.message, outcome=outcome,
                progress=progress, now=self._clock())
        log.info("experiment %s on %s: trial %d %s %s", active.experiment, active.host, measured.index + 1,
                 "ok" if measured.ok else "failed", measured.message)

    async def _set_values(self, held: _Held, request: TrialRequest, run_id: str, deadline: datetime
                          ) -> str | None:
        """Apply the desired profiles plus the trial's overlay; None, or why the agent refused."""
        overlay = overlay_profile(held.exp.name, request.point, held.device, held.beneath)
        profiles = [*held.profiles, overlay]
        generations = {**held.generations, overlay.metadata.name: request.index + 1}
        attempts = 0
        unreachable_since: datetime | None = None
        while True:
            try:
                ensure_held(self.ownership)
                result = await held.agent.apply(profiles, generations, f"{run_id}-apply",
                                                ram_share=self.ram_share)
            except AgentBusy as exc:
                await self._note(held.active, f"waiting: {exc.message}")
            except AgentUnreachable as exc:
                now = self._clock()
                unreachable_since = unreachable_since or now
                if (now - unreachable_since).total_seconds() >= self.unreachable_timeout:
                    raise HostFailed(f"the agent did not answer for {self.unreachable_timeout:g}s: "
                                     f"{exc.reason}") from None
                await self._note(held.active, f"waiting: the agent does not answer: {exc.reason}")
            except AgentError as exc:
                if exc.retryable:
                    await self._note(held.active, f"waiting: {exc.message}")
                else:
                    return f"the agent refused the trial's values: {exc.message}"
            else:
                if result.ok:
                    return None
                return "the agent refused the trial's values: " + results.report_text(result.report)
            await asyncio.sleep(self._delay(attempts))
            attempts += 1
            if await asyncio.to_thread(store.cancel_requested, self._sessions, held.active.experiment):
                raise Cancelled
            if self._clock() >= deadline:
                raise DeadlinePassed

    async def _wait_run(self, run_id: str, deadline: datetime) -> tuple[BenchmarkResult | None, str]:
        """Follow the trial's benchmark run to its end: (its result, or None and why not). A cancel,
        or the deadline, stops the run (the agent kills fio) and waits for it to end."""
        assert self._runs is not None
        cancel_sent = late = False
        while True:
            self._runs.clear()
            row, cancel = await asyncio.to_thread(store.run_state, self._sessions, run_id)
            if row is None:
                return None, f"benchmark run {run_id} is gone"
            if row.state in TERMINAL_STATES:
                if row.state == "done" and row.result is not None:
                    return BenchmarkResult.model_validate(row.result), ""
                why = f"benchmark run {run_id} {row.state}: {row.message}"
                return None, f"stopped at the deadline (spec.budget.duration): {why}" if late else why
            late = late or (not cancel and self._clock() >= deadline)
            if (cancel or late) and not cancel_sent:
                await asyncio.to_thread(store.cancel_run, self._sessions, run_id, self._clock())
                self.benchmarks.cancel(run_id)
                self.benchmarks.wake()
                cancel_sent = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._runs.wait()

    # -- the end -------------------------------------------------------------------------------
    async def _end(self, held: _Held, state: str, why: str) -> None:
        """Put the host back (desired profiles, no overlay; the winner when applyResult), retried
        until it succeeds, then release it to the reconciler."""
        active = held.active
        row = await asyncio.to_thread(store.host_row, self._sessions, active.experiment, active.host)
        progress = dict(row.progress) if row is not None else {}
        if why == "restoring":  # a restarted server finds the host being put back: as it ended then
            ending = progress.get("ending") or {}
            state, why = str(ending.get("state", "done")), str(ending.get("why", "done"))
        progress["ending"] = {"state": state, "why": why}
        await asyncio.to_thread(store.begin_restore, self._sessions, active.experiment, active.host,
                                message=results.ending_message(state, why), progress=progress,
                                now=self._clock())
        kept = ""
        if state == "done" and held.exp.spec.applyResult and why != DEADLINE:
            kept = await self._keep_winner(held)
        attempts = 0
        while True:
            try:
                profiles, generations = await self._desired(active)
                ensure_held(self.ownership)
                result = await held.agent.apply(profiles, generations,
                                                f"{active.experiment}-h{active.host_index}-end",
                                                ram_share=self.ram_share)
                if result.ok:
                    break
                message = results.report_text(result.report)
            except HostFailed as exc:
                message = str(exc)
                if "not registered" in message:
                    break  # nothing left to put back
            except AgentError as exc:
                message = exc.message
            await self._note(active, f"{results.ending_message(state, why)}; putting the host back failed, "
                                     f"retrying: {message}")
            await asyncio.sleep(self._delay(attempts))
            attempts += 1
        outcome = await asyncio.to_thread(evidence.stored_outcome, self._sessions, active.experiment)
        await self._release(active, outcome, state, results.ending_message(state, why) + kept)

    async def _keep_winner(self, held: _Held) -> str:
        """applyResult: the recommendation becomes a stored StorageProfile, so the reconciler keeps
        enforcing it (an overlay would be undone); nothing when the advice is to keep the current
        settings, or, for a fleet, when the result does not hold on every host. -> '' or, for the
        ending message, why it was not stored (a profile of that name appeared meanwhile ...)."""
        experiment = held.active.experiment
        outcome = await asyncio.to_thread(evidence.stored_outcome, self._sessions, experiment)
        if outcome is None:
            return ""
        try:
            stored = await asyncio.to_thread(results.keep_recommendation, self._sessions, held.exp, outcome,
                                             experiment_id=experiment, device=held.device,
                                             beneath=held.beneath, now=self._clock())
        except Exception as exc:  # the recommendation stays in the outcome; the host goes back anyway
            log.warning("experiment %s: the recommended profile was not stored: %s", experiment, exc)
            return f"; the recommended profile was not stored: {exc}"
        if stored is None:
            return ""
        if stored.refused:
            log.warning("experiment %s: profile %s not stored: %s", experiment, stored.name, stored.refused)
            return f"; the recommended profile {stored.name} was not stored: {stored.refused}"
        log.info("experiment %s: recommended profile %s stored (applyResult)", experiment, stored.name)
        return ""

    async def _release(self, active: ActiveHost, outcome: Mapping[str, Any] | None, state: str,
                       message: str) -> None:
        await asyncio.to_thread(store.release, self._sessions, active.experiment, active.host, state=state,
                                message=message, outcome=outcome, now=self._clock())
        log.info("experiment %s on %s %s: %s", active.experiment, active.host, state, message)
