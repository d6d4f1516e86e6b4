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

from stortune.schemas import planner
from stortune.server.agentclient import AgentBusy, AgentClient, AgentClientFactory, AgentError
from stortune.server.reconciler import report, store
from stortune.server.reconciler.decide import Decision, HostView, decide
from stortune.server.reconciler.report import Outcome, Seen, Update
from stortune.server.services.versions import VersionReader

log = logging.getLogger(__name__)


class Result(enum.Enum):
    DONE = "done"  # converged, or failed in a way retrying will not fix: forget the backoff
    RETRY = "retry"  # transient failure: again after the key's backoff
    GONE = "gone"  # the host was deleted


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


async def reconcile(deps: Deps, name: str) -> Result:
    view = await _view(deps, name)
    if view is None:
        return Result.GONE
    agent = deps.agents.for_address(view.address, view.name)
    try:
        seen = await observe(agent, view)
    except AgentBusy:
        return Result.RETRY
    except AgentError as exc:
        return await _finish(deps, name, report.unreachable(view, exc))
    decision = decide(view, planner.plan(view.profiles, seen.topology, seen.observed), seen.info.boot_id)
    if decision.new_drift:
        found = report.observed_drift(view, seen, decision)
        if await _write(deps, name, found) is Result.GONE:
            return Result.GONE
        view = view.with_status(found.conditions, found.devices)
    outcome = await execute(agent, view, decision) if decision.apply else None
    if outcome is not None and outcome.result is not None and outcome.result.ok:
        seen = await reobserve(agent, seen)
    return await _finish(deps, name, report.conclude(view, seen, decision, outcome))


async def _view(deps: Deps, name: str) -> HostView | None:
    """The host as stored now: the view kept from the last look while nothing was written since
    (one counter read, shared with concurrent ones), else read again in a thread."""
    if deps.versions is not None:
        kept = deps.views.get(name, await deps.versions.current())
        if kept is not None:
            return kept
    return await asyncio.to_thread(store.load, deps.sessions, name, deps.topologies, deps.views)


async def observe(agent: AgentClient, view: HostView) -> Seen:
    """Current values (cheap); the whole topology only when its structure changed."""
    info, observed, topology_hash = await agent.get_observed()
    if view.topology is not None and topology_hash == view.topology_hash:
        return Seen(info, view.topology, topology_hash, observed)
    info, topology, topology_hash = await agent.get_topology()
    return Seen(info, topology, topology_hash, planner.observed_of(topology), topology_changed=True)


async def reobserve(agent: AgentClient, seen: Seen) -> Seen:
    """The values an apply left, so the stored topology (dry runs, diffs) shows them at once."""
    try:
        info, observed, topology_hash = await agent.get_observed()
    except AgentError:
        return seen  # the next pass reads them
    if topology_hash != seen.topology_hash:
        return seen  # the structure changed too: the next pass fetches all of it
    return replace(seen, info=info, observed=observed)


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
