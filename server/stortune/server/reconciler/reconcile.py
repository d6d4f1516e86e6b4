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
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from stortune.api.agent.wire import WireError
from stortune.schemas import planner
from stortune.server.agentclient import (
    AgentBusy,
    AgentClient,
    AgentClientFactory,
    AgentError,
    Observation,
)
from stortune.server.reconciler import report, store
from stortune.server.reconciler.decide import Decision, HostView, decide, hold
from stortune.server.reconciler.report import Outcome, Seen, Update
from stortune.server.services.versions import VersionReader

log = logging.getLogger(__name__)


class Result(enum.Enum):
    DONE = "done"  # converged, or failed in a way retrying will not fix: forget the backoff
    RETRY = "retry"  # transient failure: again after the key's backoff
    GONE = "gone"  # the host was deleted


class QuietLooks:
    """Per host, the last look that found nothing to do, and what the agent answered then.

    A reconcile is a pure function of the host's stored view and the agent's
    answer. When neither changed since a look that wrote nothing and applied
    nothing (the same view object, read at the same resourceVersion, and an
    answer with the same host info, topology hash and values digest), this one
    would conclude the same: nothing to do. An idle fleet's drift checks then
    cost the gRPC call, not decoding, planning and comparing every value again.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[HostView, tuple[object, ...]]] = {}

    @staticmethod
    def _key(seen: Observation) -> tuple[object, ...]:
        return (seen.info, seen.topology_hash, seen.digest)

    def unchanged(self, view: HostView, seen: Observation) -> bool:
        last = self._last.get(view.name)
        return last is not None and last[0] is view and last[1] == self._key(seen)

    def remember(self, view: HostView, seen: Observation) -> None:
        self._last[view.name] = (view, self._key(seen))

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


async def reconcile(deps: Deps, name: str) -> Result:
    view = await _view(deps, name)
    if view is None:
        deps.quiet.forget(name)
        return Result.GONE
    if view.invalid:
        # Planning without such a profile would put back every setting it makes: hold the host
        # until it is replaced or deleted (either queues the host again).
        return await _finish(deps, name, report.invalid_profiles(view))
    agent = deps.agents.for_address(view.address, view.name)
    try:
        answer = await agent.get_observed()
        if deps.quiet.unchanged(view, answer):
            return Result.DONE
        seen = await observe(agent, view, answer)
    except AgentBusy:
        if view.experiment is not None:  # a trial's benchmark runs there: say why nothing is applied
            return await _finish(deps, name, report.held(view, view.experiment))
        return Result.RETRY
    except AgentError as exc:
        return await _finish(deps, name, report.unreachable(view, exc))
    decision = decide(view, planner.plan(view.profiles, seen.topology, seen.observed), seen.info.boot_id)
    if view.experiment is not None:
        decision = hold(decision, view.experiment)
    if decision.new_drift:
        found = report.observed_drift(view, seen, decision)
        if await _write(deps, name, found) is Result.GONE:
            return Result.GONE
        view = view.with_status(found.conditions, found.devices)
    outcome = await execute(agent, view, decision) if decision.apply else None
    if outcome is not None and outcome.result is not None and outcome.result.ok:
        seen = await reobserve(agent, seen)
    update = report.conclude(view, seen, decision, outcome)
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


def _values(agent: AgentClient, answer: Observation) -> report.Observed:
    try:
        return answer.observed
    except WireError as exc:
        raise AgentError(agent.address, f"GetObserved: invalid response: {exc}") from None


async def observe(agent: AgentClient, view: HostView, answer: Observation) -> Seen:
    """What ``answer`` says (cheap); the whole topology only when its structure changed."""
    if view.topology is not None and answer.topology_hash == view.topology_hash:
        return Seen(answer.info, view.topology, answer.topology_hash, _values(agent, answer))
    info, topology, topology_hash = await agent.get_topology()
    return Seen(info, topology, topology_hash, planner.observed_of(topology), topology_changed=True)


async def reobserve(agent: AgentClient, seen: Seen) -> Seen:
    """The values an apply left, so the stored topology (dry runs, diffs) shows them at once."""
    try:
        answer = await agent.get_observed()
        if answer.topology_hash != seen.topology_hash:
            return seen  # the structure changed too: the next pass fetches all of it
        return replace(seen, info=answer.info, observed=_values(agent, answer))
    except AgentError:
        return seen  # the next pass reads them


async def execute(agent: AgentClient, view: HostView, decision: Decision) -> Outcome:
    """Converge the host to exactly the profiles that select it."""
    request_id = f"{view.name}-{uuid.uuid4().hex[:12]}"
    log.info("apply %s: %s", request_id, "; ".join(decision.why))
    try:
        return Outcome(result=await agent.apply(view.profiles, decision.generations, request_id))
    except AgentError as exc:
        return Outcome(error=exc)


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
