"""Baselines: a finished run marked as the reference for a class of hosts.

A baseline names a run and a host selector (the class: ``model=r750,raid=perc``).
Runs of the same benchmark (the spec's ``metadata.name``) on hosts the
selector matches are judged against it, step by step and metric by metric,
with the noise rule: how a software vendor judges a new server against its
reference hardware. When several baselines fit a run, the most recently set
one is used.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Final

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from stortune.schemas.profile import LabelSelector
from stortune.server.db.tables import BenchmarkBaseline, BenchmarkRun
from stortune.server.errors import Cause, Conflict, Invalid, NotFound
from stortune.server.services import benchmarks, hosts

KIND: Final = "BenchmarkBaseline"


def _get(session: Session, name: str) -> BenchmarkBaseline:
    row = session.get(BenchmarkBaseline, name)
    if row is None:
        raise NotFound(KIND, name)
    return row


def get(session: Session, name: str) -> BenchmarkBaseline:
    return _get(session, name)


def list_baselines(session: Session, *, benchmark: str | None = None,
                   visible: Collection[str] | None = None) -> list[BenchmarkBaseline]:
    """By name; ``visible``: only baselines whose run is on one of these hosts."""
    stmt = select(BenchmarkBaseline, BenchmarkRun.host).join(
        BenchmarkRun, BenchmarkRun.id == BenchmarkBaseline.run_id)
    if benchmark is not None:
        stmt = stmt.where(BenchmarkBaseline.benchmark == benchmark)
    rows = session.execute(stmt.order_by(BenchmarkBaseline.name)).all()
    return [row for row, host in rows if visible is None or host in visible]


def put(session: Session, name: str, *, run_id: str, selector: LabelSelector | None, description: str,
        by: str, now: datetime) -> tuple[BenchmarkBaseline, bool]:
    """Set (create or replace) a baseline; returns it and whether it is new."""
    try:
        run = benchmarks.get(session, run_id)
    except NotFound:
        raise Invalid([Cause("run", f"no benchmark run {run_id!r}")], kind=KIND, name=name) from None
    if run.state != "done" or run.result is None:
        raise Invalid([Cause("run", f"run {run_id} is {run.state}; a baseline is a run that finished "
                             "(state done)")], kind=KIND, name=name)
    if selector is None:
        spec_selector = run.spec.get("spec", {}).get("hostSelector")
        if spec_selector is None:
            raise Invalid([Cause("hostSelector", f"required: run {run_id} was asked for one host, so "
                                 "name the class of hosts it is the reference for (e.g. model=r750)")],
                          kind=KIND, name=name)
        selector = LabelSelector.model_validate(spec_selector)
    document = selector.model_dump(mode="json", exclude_defaults=True)
    benchmark = run.name
    session.commit()  # the write below starts its own transaction
    values = {"run_id": run_id, "host_selector": document, "benchmark": benchmark,
              "description": description, "updated_at": now}
    changed = session.execute(update(BenchmarkBaseline).where(BenchmarkBaseline.name == name)
                              .values(**values).returning(BenchmarkBaseline.name)
                              .execution_options(synchronize_session=False)).first()
    created = changed is None
    if created:
        session.add(BenchmarkBaseline(name=name, created_at=now, created_by=by, **values))
    try:
        session.commit()
    except IntegrityError:  # set by someone else at the same moment
        session.rollback()
        raise Conflict(f'{KIND} "{name}" was set concurrently; try again', kind=KIND, name=name) from None
    return _get(session, name), created


def delete(session: Session, name: str) -> BenchmarkBaseline:
    row = _get(session, name)
    session.commit()  # the delete starts its own transaction (see services/benchmarks.py)
    session.delete(row)
    session.commit()
    return row


def selector_of(row: BenchmarkBaseline) -> LabelSelector:
    return LabelSelector.model_validate(row.host_selector)


def for_run(session: Session, run: BenchmarkRun) -> BenchmarkBaseline | None:
    """The baseline a run is judged against: same benchmark, the run's host in its class."""
    labels = hosts.labels_of(session, run.host)
    if labels is None:
        return None
    rows: Sequence[BenchmarkBaseline] = session.scalars(
        select(BenchmarkBaseline).where(BenchmarkBaseline.benchmark == run.name,
                                        BenchmarkBaseline.run_id != run.id)
        .order_by(BenchmarkBaseline.updated_at.desc(), BenchmarkBaseline.name)).all()
    return next((b for b in rows if selector_of(b).matches(labels)), None)
