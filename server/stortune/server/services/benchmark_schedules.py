"""Benchmark schedules: a BenchmarkSpec run on the hosts its selector matches, when cron says.

    apiVersion: stortune/v1
    kind: BenchmarkSchedule
    metadata: {name: nightly-streamers}
    spec:
      schedule: "0 3 * * *"        # five cron fields, UTC
      suspend: false
      benchmark: {apiVersion: stortune/v1, kind: BenchmarkSpec, ...}   # spec.hostSelector required

A schedule keeps its next fire time. When that time has passed, the
dispatcher fires it once, whatever number of fire times went by while the
server was down, and computes the next one after *now*. Firing is a
compare-and-set on the stored due time, so two servers sharing a database
fire a schedule once. A host whose run of the schedule is still queued or
running is skipped for that firing rather than given a second one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.documents import DocumentError
from stortune.schemas.profile import API_VERSION, is_name
from stortune.server.bench import cron
from stortune.server.db.tables import BenchmarkRun, BenchmarkSchedule
from stortune.server.errors import AlreadyExists, Cause, Invalid, NotFound
from stortune.server.models.common import unstorable
from stortune.server.services import benchmarks, hosts

KIND: Final = "BenchmarkSchedule"
_SPEC_KEYS: Final = frozenset({"schedule", "suspend", "benchmark"})


@dataclass(frozen=True)
class ScheduleDocument:
    name: str
    cron: str
    suspended: bool
    benchmark: BenchmarkSpec


def validate(data: Any, name: str | None = None) -> ScheduleDocument:
    """A request body -> ScheduleDocument, or Invalid naming every bad field by its path."""
    if not isinstance(data, dict):
        raise Invalid([Cause("", f"expected a {KIND} document (a mapping)")], kind=KIND)
    meta = data.get("metadata")
    given = meta.get("name") if isinstance(meta, dict) else None
    found = unstorable(data)
    if found:
        raise Invalid([found], kind=KIND, name=given if isinstance(given, str) else None)
    causes: list[Cause] = []
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key in data and data[key] != want:
            causes.append(Cause(key, f"{data[key]!r}; expected {want!r}"))
    for key in sorted(set(data) - {"apiVersion", "kind", "metadata", "spec"}):
        causes.append(Cause(key, "unknown field"))
    if not isinstance(given, str) or not is_name(given):
        causes.append(Cause("metadata.name", "required: a name (lower-case letters, digits, '-' and '.')"))
    elif name is not None and given != name:
        causes.append(Cause("metadata.name", f"{given!r} differs from the name in the path ({name!r})"))
    spec = data.get("spec")
    if not isinstance(spec, dict):
        raise Invalid([*causes, Cause("spec", "required: {schedule, benchmark}")], kind=KIND,
                      name=given if isinstance(given, str) else None)
    for key in sorted(set(spec) - _SPEC_KEYS):
        causes.append(Cause(f"spec.{key}", "unknown field"))
    expression = spec.get("schedule")
    normalised = ""
    try:
        if not isinstance(expression, str):
            raise ValueError("required: a cron expression, e.g. '0 3 * * *' (03:00 UTC daily)")
        normalised = cron.check(expression)
    except ValueError as exc:
        causes.append(Cause("spec.schedule", str(exc)))
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        causes.append(Cause("spec.suspend", f"{suspend!r} is not true or false"))
    benchmark: BenchmarkSpec | None = None
    try:
        benchmark = parse_benchmark(spec.get("benchmark"), "spec.benchmark")
    except DocumentError as exc:
        causes += [Cause("spec.benchmark" + (f".{p.path}" if p.path else ""), p.message)
                   for p in exc.problems]
    if benchmark is not None and benchmark.spec.hostSelector is None:
        causes.append(Cause("spec.benchmark.spec.hostSelector",
                            "required: a schedule runs on the hosts this selector matches"))
    if causes or benchmark is None:
        raise Invalid(causes, kind=KIND, name=given if isinstance(given, str) else None)
    assert isinstance(given, str)
    return ScheduleDocument(given, normalised, bool(suspend), benchmark)


def _get(session: Session, name: str) -> BenchmarkSchedule:
    row = session.get(BenchmarkSchedule, name)
    if row is None:
        raise NotFound(KIND, name)
    return row


def get(session: Session, name: str) -> BenchmarkSchedule:
    return _get(session, name)


def list_schedules(session: Session) -> Sequence[BenchmarkSchedule]:
    return session.scalars(select(BenchmarkSchedule).order_by(BenchmarkSchedule.name)).all()


def _due(doc: ScheduleDocument, now: datetime) -> datetime | None:
    return None if doc.suspended else cron.next_after(doc.cron, now)


def create(session: Session, doc: ScheduleDocument, *, by: str, now: datetime) -> BenchmarkSchedule:
    row = BenchmarkSchedule(
        name=doc.name, cron=doc.cron, spec=doc.benchmark.document(), suspended=doc.suspended,
        created_at=now, updated_at=now, created_by=by, next_due_at=_due(doc, now), last_fired_at=None,
        last_message="",
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise AlreadyExists(KIND, doc.name) from None
    return row


def replace(session: Session, doc: ScheduleDocument, *, now: datetime) -> BenchmarkSchedule:
    """Change a schedule; its next fire time is computed afresh from now."""
    changed = session.execute(
        update(BenchmarkSchedule).where(BenchmarkSchedule.name == doc.name)
        .values(cron=doc.cron, spec=doc.benchmark.document(), suspended=doc.suspended, updated_at=now,
                next_due_at=_due(doc, now))
        .returning(BenchmarkSchedule.name).execution_options(synchronize_session=False)).first()
    session.commit()
    if changed is None:
        raise NotFound(KIND, doc.name)
    return _get(session, doc.name)


def delete(session: Session, name: str) -> BenchmarkSchedule:
    """Remove the schedule; its runs stay (queued ones still run)."""
    row = _get(session, name)
    session.commit()  # the delete starts its own transaction (see services/benchmarks.py)
    session.delete(row)
    session.commit()
    return row


# -- firing ------------------------------------------------------------------------------------------
def due(session: Session, now: datetime) -> list[BenchmarkSchedule]:
    rows = session.scalars(select(BenchmarkSchedule).where(
        BenchmarkSchedule.suspended.is_(False), BenchmarkSchedule.next_due_at <= now)
        .order_by(BenchmarkSchedule.next_due_at)).all()
    session.commit()  # the firing transaction starts with its compare-and-set
    return list(rows)


def _busy_hosts(session: Session, name: str) -> set[str]:
    return set(session.scalars(select(BenchmarkRun.host).where(
        BenchmarkRun.schedule == name, BenchmarkRun.state.in_(benchmarks.ACTIVE))).all())


def _advance(session: Session, schedule: BenchmarkSchedule, after: datetime, now: datetime,
             message: str) -> bool:
    """Move the due time past now, unless another server did first (compare-and-set)."""
    won = session.execute(
        update(BenchmarkSchedule)
        .where(BenchmarkSchedule.name == schedule.name, BenchmarkSchedule.next_due_at == schedule.next_due_at,
               BenchmarkSchedule.suspended.is_(False))
        .values(next_due_at=after, last_fired_at=now, last_message=message)
        .returning(BenchmarkSchedule.name).execution_options(synchronize_session=False)).first()
    return won is not None


def fire(session: Session, schedule: BenchmarkSchedule, now: datetime) -> list[BenchmarkRun]:
    """Queue one run per matching host (skipping hosts still busy with this schedule's last run),
    and move the due time past now. Nothing when another server fired it first."""
    after = cron.next_after(schedule.cron, now)
    try:
        spec = parse_benchmark(schedule.spec, f"schedule {schedule.name}")
    except DocumentError as exc:  # stored by an older server whose documents differed
        _advance(session, schedule, after, now, f"not fired: the stored benchmark is invalid: {exc}")
        session.commit()
        return []
    selector = spec.spec.hostSelector
    names = hosts.select_names(session, selector) if selector is not None else []
    busy = _busy_hosts(session, schedule.name)
    session.commit()
    chosen = [n for n in names if n not in busy]
    parts = [f"queued {len(chosen)} run(s)"]
    if busy & set(names):
        parts.append(f"skipped {', '.join(sorted(busy & set(names)))}: the previous run is not over")
    if not names:
        parts = ["no host matches spec.hostSelector"]
    if not _advance(session, schedule, after, now, "; ".join(parts)):
        session.rollback()
        return []
    rows = [benchmarks.queued_run(spec, host, requested_by=f"schedule {schedule.name}", now=now,
                                  schedule=schedule.name) for host in chosen]
    session.add_all(rows)
    session.commit()
    return rows
