"""/api/v1/experiments: tuning experiments (sweeps and searches that recommend a StorageProfile).

    POST /experiments[?dryRun=All]             a TuningExperiment (JSON or YAML); dry run: hosts, devices,
                                               the trial plan, nothing runs
    GET  /experiments[?name=&state=&limit=]    newest first
    GET  /experiments/{id}                     live progress per host, the evidence, every trial
    POST /experiments/{id}/cancel              (or DELETE /experiments/{id}): the running trial's fio is
                                               stopped, every host put back
    GET  /experiments/{id}/charts/{kind}.{png|svg}   values | progress | heatmap | fairness
    GET  /experiments/{id}/profile[?format=yaml|json] the recommended StorageProfile

A support token sees the experiments all of whose hosts its selector matches, and no others (404).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from stortune.schemas.profile import NAME_PATTERN
from stortune.schemas.tuning.experiment import TuningExperiment, parse_experiment
from stortune.schemas.tuning.timing import hold_time
from stortune.server.api.audit import note_resource
from stortune.server.api.deps import DocumentDep, NowDep, SessionDep, SettingsDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND, TOO_MANY
from stortune.server.api.ratelimit import RateLimited
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.db.tables import Experiment
from stortune.server.errors import Conflict, NotFound
from stortune.server.models.experiments import (
    ExperimentDocument,
    ExperimentDryRun,
    ExperimentList,
    HostPlan,
    ParameterSpace,
    PlannedTrial,
)
from stortune.server.services import experiment_results, experiments, hosts
from stortune.server.tune import charts, evidence, results

router = APIRouter(prefix="/experiments", tags=["experiments"])

Reader = Annotated[Principal, Authorized(Permission.READ_EXPERIMENTS)]
Runner = Annotated[Principal, Authorized(Permission.RUN_EXPERIMENTS)]
#: Per token: each submission takes hosts for minutes to hours.
SUBMISSIONS_PER_MINUTE = 30
#: Per token: a chart costs a matplotlib rendering.
CHARTS_PER_MINUTE = 120
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_CHART: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}, "image/svg+xml": {}}, "description": "The chart"}}

DryRun = Annotated[Literal["All"] | None, Query(
    alias="dryRun", description="All: show the hosts, each one's device and trial plan; run nothing")]


class Wake:
    def wake(self) -> None:
        pass


async def get_driver(request: Request) -> Any:
    found = getattr(request.app.state, "experiments", None)
    return found if found is not None else Wake()


DriverDep = Annotated[Any, Depends(get_driver)]


async def experiment_id(experiment_id: Annotated[str, Path(description="The experiment's id (metadata.uid)",
                                                           max_length=64)]) -> str:
    if not re.fullmatch(ID_PATTERN, experiment_id):
        raise NotFound(experiments.KIND, experiment_id)  # no such id can exist
    return experiment_id


ExperimentId = Annotated[str, Depends(experiment_id)]


def _visible(session: SessionDep, who: Principal) -> set[str] | None:
    return set(hosts.select_names(session, who.hosts)) if who.hosts is not None else None


def visible_experiment(session: SessionDep, who: Principal, exp_id: str) -> Experiment:
    row = experiments.get(session, exp_id)
    seen = _visible(session, who)
    if seen is not None and not set(row.hosts) <= seen:
        raise NotFound(experiments.KIND, exp_id)  # as if it did not exist
    return row


def _document(session: SessionDep, row: Experiment, *, with_trials: bool) -> ExperimentDocument:
    host_rows = experiments.host_rows(session, row.id)
    trials = experiments.trial_rows(session, row.id)
    outcome = row.outcome
    if row.state in experiments.ACTIVE and trials:  # the evidence as it grows
        outcome = evidence.experiment_outcome(parse_experiment(row.document), host_rows, trials, row.seed)
    return ExperimentDocument.of(row, host_rows, outcome=outcome, trials=trials if with_trials else None)


# -- submitting ---------------------------------------------------------------------------------------
def _plans(session: SessionDep, exp: TuningExperiment, names: list[str]) -> list[HostPlan]:
    out = []
    for target in experiments.resolve(session, exp, names):
        baseline, _, _ = results.baseline_of(exp, target.device, target.beneath)
        members = max(1, sum(1 for d in target.beneath if d.kind.value in ("disk", "partition")))
        estimate, planned = evidence.plan_trials(exp, baseline, exp.spec.seed, members)
        from stortune.schemas.tuning.experiment import grid_size

        out.append(HostPlan(
            host=target.host, device=target.device.name, beneath=[d.name for d in target.beneath],
            baseline=baseline, gridSize=grid_size(exp.spec.parameters), estimatedTrials=estimate,
            **asdict(hold_time(exp.spec, estimate)),
            parameters=[ParameterSpace(key=p.key, values=p.choices()) for p in exp.spec.parameters],
            trials=[PlannedTrial(index=t.index, point=t.point, purpose=t.purpose, reason=t.reason)
                    for t in planned]))
    return out


@router.post("", status_code=status.HTTP_201_CREATED,
             dependencies=[RateLimited("experiments", per_minute=SUBMISSIONS_PER_MINUTE)],
             responses={**BAD_REQUEST, **TOO_MANY, **CONFLICT,
                        200: {"model": ExperimentDryRun, "description": "Dry run"}})
def create_experiment(
    *, who: Runner, body: DocumentDep, session: SessionDep, now: NowDep, request: Request,
    response: Response, settings: SettingsDep, driver: DriverDep, dry_run: DryRun = None,
) -> ExperimentDocument | ExperimentDryRun:
    """Queue the experiment on the first spec.maxHosts hosts spec.hostSelector matches. Every
    problem is a 422 naming the field (an unknown tunable, a value out of range, a scheduler the
    device's kernel does not offer, a grid over the limit ...) and nothing runs."""
    exp = experiments.validate(body, max_grid=settings.experiment_max_grid)
    note_resource(request, f"experiments/{exp.name}")
    names = experiments.select_hosts(session, exp, who.hosts)
    plans = _plans(session, exp, names)  # resolves each host's device: 422 before anything is stored
    experiment_results.check_result_name(session, exp)  # 409: applyResult would replace a profile unasked
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return ExperimentDryRun(experiment=exp.document(), hosts=plans)
    row = experiments.create(session, exp, names, requested_by=f"{who.name} (token {who.token_id})", now=now)
    driver.wake()
    return ExperimentDocument.of(row, experiments.host_rows(session, row.id))


# -- reading ----------------------------------------------------------------------------------------
@router.get("")
def list_experiments(
    *, who: Reader, session: SessionDep,
    # A name, as every metadata.name: anything else (a NUL PostgreSQL cannot even compare) is a 422.
    name: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253, description="metadata.name")]
    = None,
    state: Annotated[list[Literal["queued", "running", "done", "cancelled", "failed"]] | None,
                     Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ExperimentList:
    """Newest first, each with its hosts' progress (GET one experiment for its trials)."""
    rows = experiments.list_experiments(session, name=name, states=state, visible=_visible(session, who),
                                        limit=limit)
    return ExperimentList(items=[ExperimentDocument.of(r, experiments.host_rows(session, r.id))
                                 for r in rows])


@router.get("/{experiment_id}", responses=NOT_FOUND)
def get_experiment(who: Reader, experiment_id: ExperimentId, session: SessionDep) -> ExperimentDocument:
    """Live progress per host (trial k of n, values under test, metric so far, leader and margin),
    the evidence so far and every trial."""
    return _document(session, visible_experiment(session, who, experiment_id), with_trials=True)


# -- cancelling ---------------------------------------------------------------------------------------
def _cancel(who: Principal, experiment_id: str, session: SessionDep, *, now: NowDep, response: Response,
            driver: Any) -> ExperimentDocument:
    visible_experiment(session, who, experiment_id)
    row = experiments.cancel(session, experiment_id, now)
    if row.state == "running":
        response.status_code = status.HTTP_202_ACCEPTED
    driver.wake()
    return _document(session, row, with_trials=False)


_CANCEL_RESPONSES: dict[int | str, dict[str, Any]] = {**NOT_FOUND, 202: {
    "model": ExperimentDocument, "description": "Cancel asked: the running trial stops, hosts are put back"}}


@router.post("/{experiment_id}/cancel", responses=_CANCEL_RESPONSES)
def cancel_experiment(*, who: Runner, experiment_id: ExperimentId, session: SessionDep, now: NowDep,
                      response: Response, driver: DriverDep) -> ExperimentDocument:
    """A queued experiment ends at once (200); a running one stops its trial (the agent kills fio)
    and puts every host back to its desired state before it ends as cancelled (202)."""
    return _cancel(who, experiment_id, session, now=now, response=response, driver=driver)


@router.delete("/{experiment_id}", responses=_CANCEL_RESPONSES)
def delete_experiment(*, who: Runner, experiment_id: ExperimentId, session: SessionDep, now: NowDep,
                      response: Response, driver: DriverDep) -> ExperimentDocument:
    """The same as POST /experiments/{id}/cancel; the record and its evidence are kept."""
    return _cancel(who, experiment_id, session, now=now, response=response, driver=driver)


# -- charts and the profile ------------------------------------------------------------------------
ChartKind = Literal["values", "progress", "heatmap", "fairness"]


@router.get("/{experiment_id}/charts/{chart}", response_class=Response,
            responses={**_CHART, **NOT_FOUND, **CONFLICT},
            dependencies=[RateLimited("experiment-charts", per_minute=CHARTS_PER_MINUTE)])
def chart(
    *, who: Reader, experiment_id: ExperimentId, session: SessionDep,
    chart: Annotated[str, Path(description="values|progress|heatmap|fairness, then .png or .svg",
                               max_length=32)],
) -> Response:
    """values: the metric against each parameter's values (error bars: 95% interval); progress: the
    best so far against the trial; heatmap: the mean over two parameters; fairness: per-job CV."""
    kind, _, fmt = chart.partition(".")
    if kind not in ("values", "progress", "heatmap", "fairness") or fmt not in ("png", "svg"):
        raise NotFound("chart", chart)
    document = _document(session, visible_experiment(session, who, experiment_id), with_trials=True)
    session.close()  # rendering takes a while: give the connection back first
    try:
        data = charts.render(document, kind, fmt)  # type: ignore[arg-type]
    except charts.NoData as exc:
        raise Conflict(str(exc), kind=experiments.KIND, name=experiment_id) from None
    return Response(data, media_type=charts.MEDIA_TYPES[fmt])


@router.get("/{experiment_id}/profile", responses={**NOT_FOUND, **CONFLICT, 200: {
    "content": {"application/yaml": {}, "application/json": {}}, "description": "A StorageProfile"}})
def recommended(
    *, who: Reader, experiment_id: ExperimentId, session: SessionDep,
    format: Annotated[Literal["yaml", "json"], Query(description="yaml (default) or json")] = "yaml",
) -> Response:
    """The recommended StorageProfile, ready for a GitOps repository: its rule matches the same class
    of devices by stable facts, carries the recommended values, and its annotations name the
    experiment, workload, gain and interval. 409 until a recommendation exists."""
    row = visible_experiment(session, who, experiment_id)
    document = _document(session, row, with_trials=False)
    try:
        profile = results.profile_of(parse_experiment(row.document), document.status.outcome,
                                     experiments.host_rows(session, row.id))
    except ValueError as exc:
        raise Conflict(str(exc), kind=experiments.KIND, name=experiment_id) from None
    body = results.profile_document(profile)
    if format == "json":
        import json

        return Response(json.dumps(body, indent=2) + "\n", media_type="application/json")
    return Response(yaml.safe_dump(body, sort_keys=False), media_type="application/yaml")

