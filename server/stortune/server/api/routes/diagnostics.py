"""Diagnostics bundles for vendor support, and the mapping behind their redaction.

    GET /api/v1/hosts/{name}/diagnostics[?redact=false]   tar.gz (admin, support in its scope)
    GET /api/v1/redactions[?host=&token=]                  token -> value (admin)

A download is audited, rate limited per token (collecting runs every storage
tool of the host), and redacted unless an admin asks otherwise.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import StringConstraints
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.bundle import BundleError, pack
from stortune.schemas.redact import TOKEN_PREFIXES
from stortune.server.agentclient import AgentClientFactory, AgentError
from stortune.server.api.audit import audited
from stortune.server.api.deps import NowDep, SessionDep, SettingsDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.api.ratelimit import RateLimited
from stortune.server.api.security import Authorized, VisibleHostName
from stortune.server.auth import Permission, Principal
from stortune.server.errors import Forbidden, Unavailable
from stortune.server.models.diagnostics import RedactionList, RedactionView
from stortune.server.services import diagnostics, hosts

router = APIRouter(tags=["diagnostics"])

Downloader = Annotated[Principal, Authorized(Permission.READ_DIAGNOSTICS)]
MappingReader = Annotated[Principal, Authorized(Permission.READ_REDACTIONS)]
#: Per token: every download runs lsblk, smartctl, storcli ... on the host.
DOWNLOADS_PER_MINUTE = 6
_GZIP: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/gzip": {}}, "description": "A tar.gz with manifest.json"}}
# Two redactions at once would hand out the same new token for different values.
_MAPPING_LOCK = "diagnostics_mapping_lock"


def _mapping_lock(request: Request) -> asyncio.Lock:
    lock = getattr(request.app.state, _MAPPING_LOCK, None)
    if lock is None:
        lock = asyncio.Lock()
        setattr(request.app.state, _MAPPING_LOCK, lock)
    return lock


def _address(sessions: sessionmaker[Session], name: str) -> str:
    with sessions() as session:
        return hosts.get(session, name, with_topology=False).address


def _build(sessions: sessionmaker[Session], name: str, data: bytes, now: datetime,
           redact: bool, *, ram_share: float) -> tuple[bytes, str]:
    """(tar.gz, file name)."""
    with sessions() as session:
        host = hosts.get(session, name, with_topology=False)
        bundle, _added = diagnostics.build(session, host, data, now, redact=redact, ram_share=ram_share)
    archive = pack(bundle)
    # A redacted bundle's file name must not carry the host's name either.
    label = bundle.info.host if not redact else "host"
    return archive, f"stortune-diag-{label}-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"


@router.get("/hosts/{name}/diagnostics", response_class=Response, responses={**_GZIP, **NOT_FOUND},
            dependencies=[RateLimited("diagnostics", per_minute=DOWNLOADS_PER_MINUTE)])
@audited
async def download_diagnostics(
    *, who: Downloader, name: VisibleHostName, request: Request, now: NowDep, settings: SettingsDep,
    redact: Annotated[bool, Query(description="false: values in clear (admins only)")] = True,
    timeout: Annotated[float, Query(ge=0, le=600, description="per tool on the host, seconds;"
                                                              " 0: the agent's default")] = 0,
) -> Response:
    """The host's support bundle: the agent's collection plus desired vs observed settings,
    condition history, drift events and the profiles, redacted consistently."""
    if not redact and not who.can(Permission.READ_UNREDACTED_DIAGNOSTICS):
        raise Forbidden(f"{who.describe()} may only download redacted bundles; an admin may"
                        " ask for ?redact=false")
    sessions: sessionmaker[Session] = request.app.state.sessions
    agents: AgentClientFactory = request.app.state.agents
    address = await run_in_threadpool(_address, sessions, name)
    try:
        data = await agents.for_address(address, name).collect_diagnostics(timeout)
    except AgentError as exc:
        raise Unavailable(f"cannot collect diagnostics from the agent of {name}: {exc.message}",
                          kind="Host", name=name) from None
    try:
        async with _mapping_lock(request):
            archive, filename = await run_in_threadpool(_build, sessions, name, data, now, redact,
                                                        ram_share=settings.stripe_cache_ram_share)
    except BundleError as exc:
        raise Unavailable(f"the agent of {name} sent a bundle that does not verify: {exc}",
                          kind="Host", name=name) from None
    return Response(archive, media_type="application/gzip", headers={
        "Content-Disposition": f'attachment; filename="{filename}"',
        "X-Stortune-Redacted": "true" if redact else "false",
    })


#: What a redacted bundle holds in place of a value: HOST-0001, WWN-0042, MNT-0003... (every kind
#: the redactor has, from its own list)
RedactionToken = Annotated[str, StringConstraints(
    pattern=rf"^(?:{'|'.join(TOKEN_PREFIXES)})-[0-9]{{4,12}}$")]


@router.get("/redactions")
def list_redactions(
    who: MappingReader, session: SessionDep,
    host: Annotated[str | None, Query(max_length=253, pattern=r"^[a-z0-9.-]+$")] = None,
    token: Annotated[list[RedactionToken], Query(max_length=500,
                                                 description="Tokens to look up; repeatable")] = [],  # noqa: B006
) -> RedactionList:
    """What the tokens of redacted bundles stand for: the customer's key, never support's."""
    rows = diagnostics.list_redactions(session, host=host, tokens=token)
    return RedactionList(items=[RedactionView.from_row(r) for r in rows])
