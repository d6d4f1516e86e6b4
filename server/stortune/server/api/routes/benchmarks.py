"""/api/v1/benchmarks: runs (queue, progress, results, raw fio files), comparisons and charts.

    POST /benchmarks/runs[?host=NAME][&dryRun=All]     a BenchmarkSpec (JSON or YAML): one run per host
    GET  /benchmarks/runs[?host=&name=&state=&schedule=&limit=]    newest first, without results
    GET  /benchmarks/runs/{id}                          progress, then the normalised result
    GET  /benchmarks/runs/{id}/raw[?path=]              fio's own files (job, JSON output, stderr)
    POST /benchmarks/runs/{id}/cancel                   queued: at once; running: the agent kills fio
    GET  /benchmarks/runs/{id}/judgement                against the baseline of its host class
    GET  /benchmarks/runs/{id}/plot?kind=threads|latency&format=png|svg
    GET  /benchmarks/compare?a=ID&b=ID                  per step and metric: delta %, beyond the noise?
    GET  /benchmarks/compare/plot?a=ID&b=ID[&metric=bandwidth|iops|lat_p99|lat_mean]&format=png|svg

A support token sees the runs of the hosts its selector matches and no others (404).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.profile import NAME_PATTERN
from stortune.server.api.audit import note_resource
from stortune.server.api.deps import DocumentDep, NowDep, SessionDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND, TOO_MANY
from stortune.server.api.ratelimit import RateLimited
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.bench import judge, plots
from stortune.server.db.tables import BenchmarkRun
from stortune.server.errors import Conflict, NotFound
from stortune.server.models.benchmarks import (
    BenchmarkComparison,
    BenchmarkJudgement,
    BenchmarkRunDocument,
    BenchmarkRunList,
    ComparisonRow,
    ComparisonSummary,
    HostSteps,
    RawFileList,
    RunDryRun,
    RunRef,
)
from stortune.server.services import benchmark_baselines, benchmarks, hosts

router = APIRouter(prefix="/benchmarks", tags=["benchmarks"])

Reader = Annotated[Principal, Authorized(Permission.READ_BENCHMARKS)]
Runner = Annotated[Principal, Authorized(Permission.RUN_BENCHMARKS)]
#: Per token: each request queues a run on every host its selector matches.
RUNS_PER_MINUTE = 30
#: Per token: a chart costs a matplotlib rendering (tens to hundreds of milliseconds).
PLOTS_PER_MINUTE = 120
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_CHART: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}, "image/svg+xml": {}}, "description": "The chart"}}

DryRun = Annotated[Literal["All"] | None, Query(
    alias="dryRun", description="All: show the hosts and each one's expanded steps; queue nothing")]
HostQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253,
                                        description="Run on this host only (else spec.hostSelector)")]
Format = Annotated[Literal["png", "svg"], Query(description="png or svg")]


class Dispatch(Protocol):
    """What routes ask of the benchmark dispatcher (after their transaction committed)."""

    def wake(self) -> None: ...

    def cancel(self, run_id: str) -> None: ...


class _NoDispatch:
    def wake(self) -> None:
        pass

    def cancel(self, run_id: str) -> None:
        pass


async def get_dispatch(request: Request) -> Dispatch:
    found: Dispatch | None = getattr(request.app.state, "benchmarks", None)
    return found if found is not None else _NoDispatch()


DispatchDep = Annotated[Dispatch, Depends(get_dispatch)]


async def run_id(run_id: Annotated[str, Path(description="The run's id", max_length=64)]) -> str:
    if not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise NotFound(benchmarks.KIND, run_id)  # no such id can exist
    return run_id


RunId = Annotated[str, Depends(run_id)]


def visible_hosts(session: SessionDep, who: Principal) -> set[str] | None:
    """The hosts a scoped principal may see; None: all of them."""
    return set(hosts.select_names(session, who.hosts)) if who.hosts is not None else None


def visible_run(session: SessionDep, who: Principal, run: str, *, with_result: bool = True) -> BenchmarkRun:
    row = benchmarks.get(session, run, with_result=with_result)
    if who.hosts is not None:
        labels = hosts.labels_of(session, row.host)
        if labels is None or not who.may_see_host(labels):
            raise NotFound(benchmarks.KIND, run)  # as if it did not exist
    return row


def _result(row: BenchmarkRun) -> BenchmarkResult:
    result = benchmarks.result_of(row)
    if result is None:
        raise Conflict(f"run {row.id} has no result yet (state {row.state}"
                       f"{': ' + row.message if row.message else ''})", kind=benchmarks.KIND, name=row.id)
    return result


# -- runs ------------------------------------------------------------------------------------------
@router.post("/runs", status_code=status.HTTP_201_CREATED,
             dependencies=[RateLimited("benchmark-runs", per_minute=RUNS_PER_MINUTE)],
             responses={**BAD_REQUEST, **NOT_FOUND, **TOO_MANY,
                        200: {"model": RunDryRun, "description": "Dry run"}})
def create_runs(
    *, who: Runner, body: DocumentDep, session: SessionDep, now: NowDep, request: Request,
    response: Response, dispatch: DispatchDep, host: HostQuery = None, dry_run: DryRun = None,
) -> BenchmarkRunList | RunDryRun:
    """Queue the BenchmarkSpec on every host spec.hostSelector matches (or on ?host= alone).
    Runs of one host go one at a time, in order; an invalid spec is a 422 naming the field."""
    spec = benchmarks.validate(body)
    note_resource(request, f"benchmarks/runs/{spec.name}")
    names = benchmarks.select_hosts(session, spec, host, who.hosts)
    if dry_run:
        response.status_code = status.HTTP_200_OK
        previews = benchmarks.preview(session, spec, names)
        return RunDryRun(benchmark=spec.document(), hosts=[
            HostSteps(host=p.host, target=p.target, steps=p.steps, problems=p.problems, refusals=p.refusals)
            for p in previews])
    rows = benchmarks.create_runs(session, spec, names, requested_by=f"{who.name} (token {who.token_id})",
                                  now=now)
    dispatch.wake()
    return BenchmarkRunList(items=[BenchmarkRunDocument.from_row(r) for r in rows])


@router.get("/runs")
def list_runs(
    *, who: Reader, session: SessionDep,
    host: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253,
                                      description="The spec's metadata.name")] = None,
    state: Annotated[list[Literal["queued", "running", "done", "failed", "cancelled"]] | None,
                     Query()] = None,
    schedule: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> BenchmarkRunList:
    """Newest first, without results (GET one run for its result)."""
    rows = benchmarks.list_runs(session, host=host, name=name, states=state, schedule=schedule,
                                visible=visible_hosts(session, who), limit=limit)
    return BenchmarkRunList(items=[BenchmarkRunDocument.from_row(r) for r in rows])


@router.get("/runs/{run_id}", responses=NOT_FOUND)
def get_run(who: Reader, run_id: RunId, session: SessionDep) -> BenchmarkRunDocument:
    return BenchmarkRunDocument.from_row(visible_run(session, who, run_id), with_result=True)


@router.get("/runs/{run_id}/raw", responses=NOT_FOUND)
def get_raw(
    who: Reader, run_id: RunId, session: SessionDep,
    path: Annotated[str | None, Query(max_length=512, description="One file only")] = None,
) -> RawFileList:
    """fio's own files of every step run, as the agent kept them: job.fio, fio.json, stderr.txt."""
    visible_run(session, who, run_id, with_result=False)
    rows = list(benchmarks.raw_files(session, run_id, path))
    if path is not None and not rows:
        raise NotFound("BenchmarkRawFile", path)
    return RawFileList.from_rows(run_id, rows)


@router.post("/runs/{run_id}/cancel", responses={**NOT_FOUND, 202: {
    "model": BenchmarkRunDocument, "description": "Cancel sent: the agent stops the run"}})
def cancel_run(*, who: Runner, run_id: RunId, session: SessionDep, now: NowDep, response: Response,
               dispatch: DispatchDep) -> BenchmarkRunDocument:
    """A queued run is cancelled at once (200); a running one is stopped by its agent, which kills
    fio and keeps what finished (202, state running until it has); an ended run is left as it is."""
    visible_run(session, who, run_id, with_result=False)
    row = benchmarks.cancel(session, run_id, now)
    if row.state == "running":
        response.status_code = status.HTTP_202_ACCEPTED
        dispatch.cancel(run_id)
    dispatch.wake()
    return BenchmarkRunDocument.from_row(row)


@router.get("/runs/{run_id}/judgement", responses=NOT_FOUND)
def judge_run(who: Reader, run_id: RunId, session: SessionDep) -> BenchmarkJudgement:
    """The run against the baseline of its host class (same benchmark name, host matching the
    baseline's selector); without one, why not."""
    row = visible_run(session, who, run_id)
    ref = RunRef.from_row(row)
    result = benchmarks.result_of(row)
    if result is None:
        return BenchmarkJudgement(run=ref, message=f"no result yet (state {row.state})")
    baseline = benchmark_baselines.for_run(session, row)
    if baseline is None:
        return BenchmarkJudgement(run=ref, message=f"no baseline of benchmark {row.name!r} covers host "
                                                   f"{row.host}")
    try:
        base_row = visible_run(session, who, baseline.run_id)
    except NotFound:
        return BenchmarkJudgement(run=ref, message="the baseline's run is not visible to this token")
    base = benchmarks.result_of(base_row)
    if base is None:
        return BenchmarkJudgement(run=ref, baseline=baseline.name, message="the baseline run has no result")
    comparison = judge.judge(base, result)
    summary = ComparisonSummary.of(comparison)
    verdict = (f"{summary.worse} metric(s) worse than baseline {baseline.name}" if summary.worse else
               f"no metric worse than baseline {baseline.name} beyond the noise")
    return BenchmarkJudgement(
        run=ref, baseline=baseline.name, baselineRun=RunRef.from_row(base_row), message=verdict,
        rows=_rows(comparison), summary=summary, contextChanges=comparison.context)


@router.get("/runs/{run_id}/plot", response_class=Response, responses={**_CHART, **NOT_FOUND, **CONFLICT},
            dependencies=[RateLimited("benchmark-plots", per_minute=PLOTS_PER_MINUTE)])
def plot_run(
    *, who: Reader, run_id: RunId, session: SessionDep, format: Format = "png",
    kind: Annotated[Literal["threads", "latency"], Query(
        description="threads: bandwidth by thread count per workload; latency: p50/p95/p99/p99.9",
    )] = "threads",
) -> Response:
    result = _result(visible_run(session, who, run_id))
    session.close()  # rendering takes a while: give the connection back first
    draw = plots.threads_chart if kind == "threads" else plots.latency_chart
    try:
        data = draw(result, format)
    except plots.NoData as exc:
        raise Conflict(str(exc), kind=benchmarks.KIND, name=run_id) from None
    return Response(data, media_type=plots.MEDIA_TYPES[format])


# -- comparisons -------------------------------------------------------------------------------------
def _rows(comparison: judge.Comparison) -> list[ComparisonRow]:
    return [ComparisonRow.of(d, objective=comparison.is_objective(d)) for d in comparison.deltas]


CompareId = Annotated[str, Query(pattern=RUN_ID_PATTERN, max_length=64)]


def _pair(session: SessionDep, who: Principal, a: str, b: str
          ) -> tuple[BenchmarkRun, BenchmarkRun, BenchmarkResult, BenchmarkResult]:
    row_a, row_b = visible_run(session, who, a), visible_run(session, who, b)
    return row_a, row_b, _result(row_a), _result(row_b)


@router.get("/compare", responses={**NOT_FOUND, **CONFLICT})
def compare_runs(who: Reader, session: SessionDep, a: CompareId, b: CompareId) -> BenchmarkComparison:
    """B against A: per step both ran and per metric, means, delta %, and whether it exceeds the
    noise (docs/benchmarks.md); plus what differed in their contexts."""
    row_a, row_b, result_a, result_b = _pair(session, who, a, b)
    comparison = judge.judge(result_a, result_b)
    return BenchmarkComparison(
        a=RunRef.from_row(row_a), b=RunRef.from_row(row_b), rows=_rows(comparison),
        summary=ComparisonSummary.of(comparison), contextChanges=comparison.context)


@router.get("/compare/plot", response_class=Response, responses={**_CHART, **NOT_FOUND, **CONFLICT},
            dependencies=[RateLimited("benchmark-plots", per_minute=PLOTS_PER_MINUTE)])
def plot_comparison(
    *, who: Reader, session: SessionDep, a: CompareId, b: CompareId, format: Format = "png",
    metric: Annotated[Literal["bandwidth", "iops", "lat_p99", "lat_mean"], Query(
        description="Which figure of each step the bars show")] = "bandwidth",
) -> Response:
    """Before/after bars per step, error bars one standard deviation, each pair labelled with the
    change, its noise and the verdict; under them, what changed between the runs."""
    _, _, result_a, result_b = _pair(session, who, a, b)
    session.close()
    try:
        comparison = judge.judge(result_a, result_b)
        data = plots.compare_chart(result_a, result_b, comparison.deltas, format, metric,
                                   changes=comparison.context)
    except plots.NoData as exc:
        raise Conflict(str(exc)) from None
    return Response(data, media_type=plots.MEDIA_TYPES[format])
