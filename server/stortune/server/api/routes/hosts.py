"""/api/v1/hosts: what agents registered, with the labels operators set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from stortune.server.agentclient import AgentClientFactory
from stortune.server.api import label_selector
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.cached_reads import READ_HOSTS, host_key, page_key, status_key
from stortune.server.api.deps import NowDep, SessionDep, SettingsDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.api.rendered import DocumentCache, join_list, respond
from stortune.server.api.security import Authorized, VisibleHostName
from stortune.server.auth import Permission, Principal
from stortune.server.errors import Cause, Invalid, NotFound
from stortune.server.models.hosts import (
    HostDocument,
    HostLease,
    HostList,
    HostStatus,
    LabelsMerge,
    LabelsReplace,
)
from stortune.server.models.meta import ListMeta, format_resource_version
from stortune.server.services import analysis, host_pages, hosts
from stortune.server.services.fleet_state import FleetState
from stortune.server.services.versions import current_resource_version

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/hosts", tags=["hosts"])

Selector = Annotated[str | None, Query(alias="labelSelector", max_length=4096)]
ConditionQuery = Annotated[list[str] | None, Query(
    alias="condition", max_length=host_pages.MAX_CONDITIONS,
    description="TYPE=STATUS, e.g. Drifted=True or Ready=False; repeat for several (all must hold)")]
# Reads by a support token reach only the hosts its selector matches (VisibleHostName).
Reader = Annotated[Principal, Authorized(READ_HOSTS)]
Labeller = Annotated[Principal, Authorized(Permission.LABEL_HOSTS)]
Remover = Annotated[Principal, Authorized(Permission.DELETE_HOSTS)]


# The GETs below answer from encoded bodies kept until the next write (api/rendered.py),
# with an ETag for If-None-Match; while a body is current, api/cached_reads.py answers
# the same requests before routing, under the same keys.
def _documents(request: Request, session: Session, wanted: Sequence[tuple[str, int]]) -> list[bytes]:
    """The encoded documents of ``wanted`` (name, resourceVersion); only changed hosts are loaded."""
    def render(names: Sequence[str]) -> list[tuple[str, int, bytes]]:
        return [(row.name, row.resource_version, HostDocument.from_row(row).model_dump_json().encode())
                for row in hosts.rows(session, names)]

    cache: DocumentCache = request.app.state.host_documents
    return cache.encoded(wanted, render)


@router.get("", response_model=HostList)
async def list_hosts(
    *, who: Reader, request: Request, selector: Selector = None, conditions: ConditionQuery = None,
    limit: Annotated[int | None, Query(ge=1, le=host_pages.MAX_LIMIT, description=(
        "At most this many hosts, sorted by name; metadata.continue then names the next page"
        " (Kubernetes' list chunking). Without it, every host."))] = None,
    continue_token: Annotated[str | None, Query(alias="continue", max_length=host_pages.MAX_CONTINUE,
                                                description="metadata.continue of the previous page")]
    = None,
) -> Response:
    """The hosts, by name. Filters: ``labelSelector``, ``condition=TYPE=STATUS`` (repeatable, all
    must hold, e.g. ``Drifted=True``; a host without the condition counts as Unknown). Answered
    from the fleet's in-memory index and the documents kept at each host's resourceVersion."""
    parsed = label_selector.parse(selector)  # a bad selector or condition is refused before any lookup
    wanted_conditions = host_pages.parse_conditions(conditions)
    after = host_pages.decode_continue(continue_token) if continue_token is not None else None
    if after is not None and limit is None:
        raise Invalid([Cause("limit", "a continue token pages: send the limit it was made with")])

    def render(session: Session) -> bytes:
        version = current_resource_version(session)
        fleet: FleetState = request.app.state.fleet
        fleet.refresh()  # at least as new as the counter just read
        records, everyone = fleet.snapshot()
        names = host_pages.matching(records, everyone, selector=parsed, conditions=wanted_conditions,
                                    visible=who.may_see_host)
        meta = ListMeta(resourceVersion=format_resource_version(version))
        if limit is not None:
            shown = host_pages.page(names, limit=limit, after=after)
            names = shown.names
            meta = ListMeta(resourceVersion=meta.resourceVersion, remainingItemCount=shown.remaining,
                            continue_=shown.next)
        wanted = [(name, records[name].version) for name in names]
        envelope = HostList(metadata=meta, items=[])
        return join_list(envelope.model_dump_json(by_alias=True).encode(),
                         _documents(request, session, wanted))

    scope = who.hosts.model_dump_json() if who.hosts is not None else ""
    return await respond(request, page_key(selector, scope, wanted_conditions, limit, after), render)


@router.get("/{name}", response_model=HostDocument, responses=NOT_FOUND)
async def get_host(who: Reader, name: VisibleHostName, request: Request) -> Response:
    def render(session: Session) -> bytes:
        found = _documents(request, session, [(name, hosts.resource_version(session, name))])
        if not found:
            raise NotFound(hosts.KIND, name)
        return found[0]

    return await respond(request, host_key(name), render)


@router.get("/{name}/status", response_model=HostStatus, responses=NOT_FOUND)
async def get_host_status(who: Reader, name: VisibleHostName, request: Request) -> Response:
    def render(session: Session) -> bytes:
        return HostStatus.from_row(hosts.get(session, name, with_topology=False)).model_dump_json().encode()

    return await respond(request, status_key(name), render)


@router.get("/{name}/lease", responses=NOT_FOUND)
def get_host_lease(who: Reader, name: VisibleHostName, session: SessionDep) -> HostLease:
    """When the agent last renewed its lease and when it runs out (changes with every heartbeat)."""
    return HostLease.from_row(*hosts.lease(session, name))


@router.get("/{name}/topology", responses=NOT_FOUND)
def get_host_topology(who: Reader, name: VisibleHostName, session: SessionDep) -> dict[str, Any] | None:
    """The Topology the agent last reported (null until it has)."""
    return hosts.get(session, name).topology


@router.get("/{name}/analysis", responses=NOT_FOUND)
def get_host_analysis(
    who: Reader, name: VisibleHostName, session: SessionDep, settings: SettingsDep,
    runs: Annotated[int, Query(ge=1, le=analysis.MAX_RUNS,
                               description="Latest finished benchmark runs compared for slow members")]
    = analysis.DEFAULT_RUNS,
) -> dict[str, Any]:
    """Where the host's limits are: every device's layers with their ceilings and where they
    came from, the layout checks, members slower than their peers across runs, path balance.
    409 until the agent has reported its topology."""
    return analysis.analyze(session, name, runs=runs,
                            ram_share=settings.stripe_cache_ram_share).model_dump(mode="json")


@router.put("/{name}/labels", responses=NOT_FOUND)
def replace_host_labels(
    who: Labeller, name: VisibleHostName, body: LabelsReplace, session: SessionDep, now: NowDep
) -> HostDocument:
    """Set the API labels. They win over labels the agent reports for the same key."""
    return HostDocument.from_row(hosts.set_labels(session, name, dict(body.labels), merge=False, now=now))


@router.patch("/{name}/labels", responses=NOT_FOUND)
def merge_host_labels(
    who: Labeller, name: VisibleHostName, body: LabelsMerge, session: SessionDep, now: NowDep
) -> HostDocument:
    """Merge into the API labels; a null value removes the key."""
    return HostDocument.from_row(hosts.set_labels(session, name, body.labels, merge=True, now=now))


@router.delete("/{name}", responses=NOT_FOUND)
async def delete_host(who: Remover, name: VisibleHostName, request: Request, session: SessionDep,
                      now: NowDep) -> HostDocument:
    """Declare the host gone: profiles being deleted stop waiting for it, and its agent is not
    dialled again."""
    gone = await run_in_threadpool(lambda: HostDocument.from_row(hosts.delete(session, name, now)))
    # Here at once; the reconciler that owns the host does the same when it finds it gone.
    agents: AgentClientFactory = request.app.state.agents
    await agents.forget_host(name)
    return gone
