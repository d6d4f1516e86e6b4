"""/api/v1/hosts: what agents registered, with the labels operators set."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from stortune.server.api import label_selector
from stortune.server.api.deps import HostName, NowDep, SessionDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.models.hosts import HostDocument, HostList, HostStatus, LabelsMerge, LabelsReplace
from stortune.server.models.meta import ListMeta, format_resource_version
from stortune.server.services import hosts

router = APIRouter(prefix="/hosts", tags=["hosts"])

Selector = Annotated[str | None, Query(alias="labelSelector", max_length=4096)]


@router.get("")
def list_hosts(session: SessionDep, selector: Selector = None) -> HostList:
    rows, version = hosts.list_hosts(session, label_selector.parse(selector))
    return HostList(metadata=ListMeta(resourceVersion=format_resource_version(version)),
                    items=[HostDocument.from_row(r) for r in rows])


@router.get("/{name}", responses=NOT_FOUND)
def get_host(name: HostName, session: SessionDep) -> HostDocument:
    return HostDocument.from_row(hosts.get(session, name))


@router.get("/{name}/status", responses=NOT_FOUND)
def get_host_status(name: HostName, session: SessionDep) -> HostStatus:
    return HostStatus.from_row(hosts.get(session, name))


@router.get("/{name}/topology", responses=NOT_FOUND)
def get_host_topology(name: HostName, session: SessionDep) -> dict[str, Any] | None:
    """The Topology the agent last reported (null until it has)."""
    return hosts.get(session, name).topology


@router.put("/{name}/labels", responses=NOT_FOUND)
def replace_host_labels(
    name: HostName, body: LabelsReplace, session: SessionDep, now: NowDep
) -> HostDocument:
    """Set the API labels. They win over labels the agent reports for the same key."""
    return HostDocument.from_row(hosts.set_labels(session, name, dict(body.labels), merge=False, now=now))


@router.patch("/{name}/labels", responses=NOT_FOUND)
def merge_host_labels(
    name: HostName, body: LabelsMerge, session: SessionDep, now: NowDep
) -> HostDocument:
    """Merge into the API labels; a null value removes the key."""
    return HostDocument.from_row(hosts.set_labels(session, name, body.labels, merge=True, now=now))


@router.delete("/{name}", responses=NOT_FOUND)
def delete_host(name: HostName, session: SessionDep, now: NowDep) -> HostDocument:
    """Declare the host gone: profiles being deleted stop waiting for it."""
    return HostDocument.from_row(hosts.delete(session, name, now))
