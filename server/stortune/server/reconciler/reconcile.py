"""One reconcile of one host: read, ask the agent, decide, act, write status.

Level-triggered: every pass re-reads the host, its profiles and the agent's
values, whatever woke it, so a missed or merged request loses nothing. The
database is touched in short transactions in threads, never while a gRPC call
is in flight; deciding is ``decide`` and ``report`` (pure), acting is
``execute`` (the one call that changes a host).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from stortune.api.agent.wire import WireError
from stortune.schemas import planner, stripecache
from stortune.server.agentclient import (
    AgentBusy,
    AgentClient,
    AgentClientFactory,
    AgentError,
    AgentRejected,
    AgentUnreachable,
    Observation,
)
from stortune.server.metrics.recorder import Recorder
from stortune.server.reconciler import report, store
from stortune.server.reconciler.decide import REBOOTED, Decision, HostView, decide, hold
from stortune.server.reconciler.report import Outcome, Seen, Update
from stortune.server.services.versions import VersionReader
from stortune.server.shards import AllShards, LeaseLost, Ownership, fenced

log = logging.getLogger(__name__)


class Result(enum.Enum):
    DONE = "done"  # converged, or failed in a way retrying will not fix: forget the backoff
    RETRY = "retry"  # transient failure: again after the key's backoff
    GONE = "gone"  # the host was deleted
    ELSEWHERE = "elsewhere"  # another server owns the host's shard (now, or since the pass began)


class QuietLooks:
    """Per host, the last look that found nothing to do, what the agent answered then, and when.

    A reconcile is a pure function of the host's stored view and the agent's
    answer. When neither changed since a look that wrote nothing and applied
    nothing (the same view object, read at the same resourceVersion, and an
    answer with the same host info, topology hash and values digest), this one
    would conclude the same: nothing to do. An idle fleet's drift checks then
    cost the gRPC call, not decoding, planning and comparing every value again.

    An agent that reports its values' digest says the same without being asked: while
    the digest it last reported is the one of the last quiet look, the periodic pass need
    not look at all (``settled``), but for a look now and then (the runner paces them).
    Every change on the control plane's side asks for a look of its own.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._last: dict[str, tuple[HostView, tuple[object, ...], float, Observation]] = {}
        self._monotonic = monotonic

    @staticmethod
    def _key(seen: Observation) -> tuple[object, ...]:
        return (seen.info, seen.topology_hash, seen.digest)

    def unchanged(self, view: HostView, seen: Observation) -> bool:
        last = self._last.get(view.name)
        return last is not None and last[0] is view and last[1] == self._key(seen)

    def remember(self, view: HostView, seen: Observation) -> None:
        self._last[view.name] = (view, self._key(seen), self._monotonic(), seen)

    def answer(self, name: str) -> Observation | None:
        """The agent's answer at the last quiet look."""
        last = self._last.get(name)
        return None if last is None else last[3]

    def settled(self, name: str, reported: str | None, since: float) -> bool:
        """The agent's last reported digest is the last quiet look's, and that look was at or
        after ``since`` (monotonic)."""
        last = self._last.get(name)
        return reported is not None and last is not None and last[1][2] == reported and last[2] >= since

    def forget(self, name: str) -> None:
        self._last.pop(name, None)


@dataclass(frozen=True)
class Deps:
    sessions: store.Sessions
    agents: AgentClientFactory
    clock: Callable[[], datetime]
    #: Called after each status write (profile summaries are due).
    wrote: Callable[[], None] = lambda: None
    topologies: store.Topologies = field(default_factory=store.Topologies)
    views: store.Views = field(default_factory=store.Views)
    #: The resourceVersion counter, read in batches on the event loop.
    versions: VersionReader | None = None
    quiet: QuietLooks = field(default_factory=QuietLooks)
    #: A stripe_cache_size costing more of the host's RAM is refused (Settings.stripe_cache_ram_share).
    ram_share: float = stripecache.DEFAULT_RAM_SHARE
    #: Counts of drift, corrections, failed applies and agent errors (/metrics).
    metrics: Recorder = field(default_factory=Recorder)
    #: Which hosts this server works on; every transaction of a pass is fenced by the host's lease.
    ownership: Ownership = field(default_factory=AllShards)


async def reconcile(deps: Deps, name: str) -> Result:
    """One pass over ``name``, timed for the reconcile duration histogram."""
    started = time.perf_counter()
    result = Result.RETRY  # an exception escaping is retried by the runner
    fence = deps.ownership.fence(name)
    if fence is None:
        return Result.ELSEWHERE
    try:
        with fenced(fence), deps.ownership.working(fence):
            result = await _reconcile(deps, name, lambda: deps.ownership.holds(fence))
        return result
    except LeaseLost as exc:
        log.info("%s; its new owner takes it from here", exc)
        result = Result.ELSEWHERE
        return result
    finally:
        deps.metrics.reconciled(result.value, time.perf_counter() - started)


async def _reconcile(deps: Deps, name: str, still_mine: Callable[[], bool]) -> Result:
    view = await _view(deps, name)
    if view is None:
        deps.quiet.forget(name)
        await deps.agents.forget_host(name)  # its channel would go on dialling the address
        return Result.GONE
    if view.invalid:
        # Planning without such a profile would put back every setting it makes: hold the host
        # until it is replaced or deleted (either queues the host again).
        return await _finish(deps, name, report.invalid_profiles(view))
    agent = deps.agents.for_address(view.address, view.name)
    try:
        answer = await _still_reported(deps, view) or await agent.get_observed()
        if deps.quiet.unchanged(view, answer):
            return Result.DONE
        seen = await observe(agent, view, answer)
    except AgentBusy:
        deps.metrics.rpc_error("busy")
        if view.experiment is not None:  # a trial's benchmark runs there: say why nothing is applied
            return await _finish(deps, name, report.held(view, view.experiment))
        return Result.RETRY
    except AgentError as exc:
        deps.metrics.rpc_error(error_kind(exc))
        return await _finish(deps, name, report.unreachable(view, exc))
    planned = planner.plan(view.profiles, seen.topology, seen.observed, stripe_cache_ram_share=deps.ram_share)
    decision = decide(view, planned, seen.info.boot_id)
    if view.experiment is not None:
        decision = hold(decision, view.experiment)
    if decision.new_drift:
        found = report.observed_drift(view, seen, decision)
        if await _write(deps, name, found) is Result.GONE:
            return Result.GONE
        view = view.with_status(found.conditions, found.devices)
    if decision.apply and not still_mine():  # the lease lapsed while the agent answered: not ours to apply
        return Result.ELSEWHERE
    outcome = await execute(agent, view, decision, deps.ram_share) if decision.apply else None
    count(deps.metrics, decision, outcome)
    if outcome is not None and outcome.result is not None and outcome.result.ok:
        seen = await reobserve(agent, seen, outcome.result.observation)
    update = report.conclude(view, seen, decision, outcome)
    if outcome is not None and seen.digest is not None:
        update.observed_digest = seen.digest
    if not decision.new_drift and outcome is None and update.empty and not update.retry:
        deps.quiet.remember(view, answer)
    return await _finish(deps, name, update)


async def _view(deps: Deps, name: str) -> HostView | None:
    """The host as stored now: the view kept from the last look while nothing was written since
    (one counter read, shared with concurrent ones), else read again in a thread."""
    if deps.versions is not None:
        kept = deps.views.get(name, await deps.versions.current())
        if kept is not None:
            return kept
    return await asyncio.to_thread(store.load, deps.sessions, name, deps.topologies, deps.views)


async def _still_reported(deps: Deps, view: HostView) -> Observation | None:
    """The answer of the host's last quiet look, if its agent's latest report says its values are
    still those (same digest, boot and device structure): a look for a change on this side (a
    profile, labels) then needs no call to ask for them. None: ask."""
    last = deps.quiet.answer(view.name)
    if last is None or last.topology_hash != view.topology_hash or last.info.boot_id != view.boot_id:
        return None
    reported = await asyncio.to_thread(store.reported_digest, deps.sessions, view.name)
    return last if reported == last.digest else None


def _values(agent: AgentClient, answer: Observation) -> report.Observed:
    try:
        return answer.observed
    except WireError as exc:
        raise AgentError(agent.address, f"GetObserved: invalid response: {exc}") from None


async def observe(agent: AgentClient, view: HostView, answer: Observation) -> Seen:
    """What ``answer`` says (cheap); the whole topology only when its structure changed."""
    if view.topology is not None and answer.topology_hash == view.topology_hash:
        return Seen(answer.info, view.topology, answer.topology_hash, _values(agent, answer),
                    digest=answer.digest)
    info, topology, topology_hash = await agent.get_topology()
    return Seen(info, topology, topology_hash, planner.observed_of(topology), topology_changed=True)


async def reobserve(agent: AgentClient, seen: Seen, answer: Observation | None = None) -> Seen:
    """The values an apply left, so the stored topology (dry runs, diffs) shows them at once:
    from the Apply's answer, or asked again of an agent older than that."""
    try:
        if answer is None:
            answer = await agent.get_observed()
        if answer.topology_hash != seen.topology_hash:
            return seen  # the structure changed too: the next pass fetches all of it
        return replace(seen, info=answer.info, observed=_values(agent, answer), digest=answer.digest)
    except AgentError:
        return seen  # the next pass reads them


async def execute(agent: AgentClient, view: HostView, decision: Decision, ram_share: float) -> Outcome:
    """Converge the host to exactly the profiles that select it, the agent held to ``ram_share``."""
    request_id = f"{view.name}-{uuid.uuid4().hex[:12]}"
    log.info("apply %s: %s", request_id, "; ".join(decision.why))
    try:
        # The share travels: the agent holds to it too, so what it writes matches what this planned.
        return Outcome(result=await agent.apply(view.profiles, decision.generations, request_id,
                                                ram_share=ram_share))
    except AgentError as exc:
        return Outcome(error=exc)


def error_kind(error: AgentError) -> str:
    """A bounded label for an agent call's failure (the message itself is the event's)."""
    if isinstance(error, AgentUnreachable):
        return "unreachable"
    if isinstance(error, AgentBusy):
        return "busy"
    if isinstance(error, AgentRejected):
        return "rejected"
    return "error"


def _cause(cause: str) -> str:
    return "reboot" if cause == REBOOTED else "runtime"


def count(metrics: Recorder, decision: Decision, outcome: Outcome | None) -> None:
    """Drift found, drift corrected, applies failed: what /metrics counts of one reconcile."""
    causes = {(d.device_id, d.tunable): _cause(d.cause) for d in decision.new_drift}
    for d in decision.new_drift:
        metrics.drift(d.tunable, causes[(d.device_id, d.tunable)])
    if outcome is None:
        return
    if outcome.error is not None:
        kind = error_kind(outcome.error)
        metrics.rpc_error(kind)
        if kind != "busy":  # a benchmark or experiment holds the host: a planned wait, no failure
            metrics.apply_failed(kind)
        return
    result = outcome.result
    if result is None:
        return
    if not result.ok:
        metrics.apply_failed("rejected" if result.plan.fatal else "failed")
        return
    for want in report.corrected(decision, result):
        # Drift seen by an earlier pass (audit mode, a failed apply) keeps no cause.
        metrics.corrected(want.tunable, causes.get((want.device_id, want.tunable), "earlier"))


async def _write(deps: Deps, name: str, update: Update) -> Result:
    if update.empty:
        return Result.DONE
    if not await asyncio.to_thread(store.write, deps.sessions, name, update, deps.clock()):
        return Result.GONE
    if update.topology is not None:  # the stored values were refreshed under the same hash
        deps.topologies.put(update.topology[1], update.topology[0])
    for event in update.events:
        log.log(logging.WARNING if event.type == "Warning" else logging.INFO, "%s: %s: %s", name,
                event.reason, event.message)
    deps.wrote()
    return Result.DONE


async def _finish(deps: Deps, name: str, update: Update) -> Result:
    written = await _write(deps, name, update)
    if written is Result.GONE:
        return written
    return Result.RETRY if update.retry else Result.DONE
