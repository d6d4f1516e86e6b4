"""/api/v1/benchmarks/schedules: BenchmarkSpecs run by cron on the hosts their selector matches.

    POST   /benchmarks/schedules            a BenchmarkSchedule document (JSON or YAML)
    GET    /benchmarks/schedules
    GET    /benchmarks/schedules/{name}
    PUT    /benchmarks/schedules/{name}     replace (suspend, change the time or the benchmark)
    DELETE /benchmarks/schedules/{name}     its runs stay

Schedules select hosts across the fleet, so scoped (support) tokens may not read them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status

from stortune.schemas.profile import is_name
from stortune.server.api.audit import note_resource
from stortune.server.api.deps import DocumentDep, NamePath, NowDep, SessionDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND
from stortune.server.api.routes.benchmarks import DispatchDep
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.errors import Forbidden, NotFound
from stortune.server.models.benchmarks import BenchmarkScheduleDocument, BenchmarkScheduleList
from stortune.server.services import benchmark_schedules

router = APIRouter(prefix="/benchmarks/schedules", tags=["benchmarks"])

Reader = Annotated[Principal, Authorized(Permission.READ_BENCHMARKS)]
Writer = Annotated[Principal, Authorized(Permission.RUN_BENCHMARKS)]


async def schedule_name(name: NamePath) -> str:
    if not is_name(name):  # no schedule can have it
        raise NotFound(benchmark_schedules.KIND, name)
    return name


ScheduleName = Annotated[str, Depends(schedule_name)]


def _unscoped(who: Principal) -> None:
    if who.scoped:
        raise Forbidden(f"{who.describe()} may not read benchmark schedules: they select hosts across "
                        "the fleet, beyond a scoped token's hosts")


@router.get("")
def list_schedules(who: Reader, session: SessionDep) -> BenchmarkScheduleList:
    _unscoped(who)
    return BenchmarkScheduleList(items=[BenchmarkScheduleDocument.from_row(r)
                                        for r in benchmark_schedules.list_schedules(session)])


@router.post("", status_code=status.HTTP_201_CREATED, responses={**BAD_REQUEST, **CONFLICT})
def create_schedule(*, who: Writer, body: DocumentDep, session: SessionDep, now: NowDep, request: Request,
                    dispatch: DispatchDep) -> BenchmarkScheduleDocument:
    doc = benchmark_schedules.validate(body)
    note_resource(request, f"benchmarks/schedules/{doc.name}")
    row = benchmark_schedules.create(session, doc, by=f"{who.name} (token {who.token_id})", now=now)
    dispatch.wake()
    return BenchmarkScheduleDocument.from_row(row)


@router.get("/{name}", responses=NOT_FOUND)
def get_schedule(who: Reader, name: ScheduleName, session: SessionDep) -> BenchmarkScheduleDocument:
    _unscoped(who)
    return BenchmarkScheduleDocument.from_row(benchmark_schedules.get(session, name))


@router.put("/{name}", responses={**BAD_REQUEST, **NOT_FOUND})
def replace_schedule(*, who: Writer, name: ScheduleName, body: DocumentDep, session: SessionDep, now: NowDep,
                     dispatch: DispatchDep) -> BenchmarkScheduleDocument:
    """Replace the schedule; its next run time is computed afresh from now."""
    doc = benchmark_schedules.validate(body, name)
    row = benchmark_schedules.replace(session, doc, now=now)
    dispatch.wake()
    return BenchmarkScheduleDocument.from_row(row)


@router.delete("/{name}", responses=NOT_FOUND)
def delete_schedule(who: Writer, name: ScheduleName, session: SessionDep) -> BenchmarkScheduleDocument:
    """Remove the schedule; runs it queued stay (and queued ones still run)."""
    return BenchmarkScheduleDocument.from_row(benchmark_schedules.delete(session, name))
