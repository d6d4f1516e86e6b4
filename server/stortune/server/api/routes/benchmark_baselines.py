"""/api/v1/benchmarks/baselines: runs marked as the reference for a class of hosts.

    PUT    /benchmarks/baselines/{name}   {run, hostSelector, description}: set (201 new, 200 replaced)
    GET    /benchmarks/baselines[?benchmark=]
    GET    /benchmarks/baselines/{name}
    DELETE /benchmarks/baselines/{name}

A run of the same benchmark (spec name) on a host the selector matches is judged
against the baseline: GET /benchmarks/runs/{id}/judgement.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response, status

from stortune.schemas.profile import NAME_PATTERN, is_name
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.deps import NamePath, NowDep, SessionDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.api.routes.benchmarks import visible_hosts, visible_run
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.errors import NotFound
from stortune.server.models.benchmarks import BaselineSet, BenchmarkBaselineDocument, BenchmarkBaselineList
from stortune.server.services import benchmark_baselines

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/benchmarks/baselines", tags=["benchmarks"])

Reader = Annotated[Principal, Authorized(Permission.READ_BENCHMARKS)]
Setter = Annotated[Principal, Authorized(Permission.RUN_BENCHMARKS)]


async def baseline_name(name: NamePath) -> str:
    if not is_name(name):  # no baseline can have it
        raise NotFound(benchmark_baselines.KIND, name)
    return name


BaselineName = Annotated[str, Depends(baseline_name)]


@router.get("")
def list_baselines(
    who: Reader, session: SessionDep,
    benchmark: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
) -> BenchmarkBaselineList:
    rows = benchmark_baselines.list_baselines(session, benchmark=benchmark,
                                              visible=visible_hosts(session, who))
    return BenchmarkBaselineList(items=[BenchmarkBaselineDocument.from_row(r) for r in rows])


@router.get("/{name}", responses=NOT_FOUND)
def get_baseline(who: Reader, name: BaselineName, session: SessionDep) -> BenchmarkBaselineDocument:
    row = benchmark_baselines.get(session, name)
    try:
        visible_run(session, who, row.run_id, with_result=False)
    except NotFound:  # a scoped token does not see the run's host: nor the baseline
        raise NotFound(benchmark_baselines.KIND, name) from None
    return BenchmarkBaselineDocument.from_row(row)


@router.put("/{name}", responses={**NOT_FOUND, 201: {"model": BenchmarkBaselineDocument,
                                                     "description": "Created"}})
def set_baseline(*, who: Setter, name: BaselineName, body: BaselineSet, session: SessionDep, now: NowDep,
                 response: Response) -> BenchmarkBaselineDocument:
    """Mark a finished run as the reference of the hosts hostSelector matches (default: the run's
    spec.hostSelector) for its benchmark."""
    selector = body.hostSelector if not isinstance(body.hostSelector, str) else None
    row, created = benchmark_baselines.put(session, name, run_id=body.run, selector=selector,
                                           description=body.description,
                                           by=f"{who.name} (token {who.token_id})", now=now)
    if created:
        response.status_code = status.HTTP_201_CREATED
    return BenchmarkBaselineDocument.from_row(row)


@router.delete("/{name}", responses=NOT_FOUND)
def delete_baseline(who: Setter, name: BaselineName, session: SessionDep) -> BenchmarkBaselineDocument:
    return BenchmarkBaselineDocument.from_row(benchmark_baselines.delete(session, name))
