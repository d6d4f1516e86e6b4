"""The dispatcher's database side: one short transaction per call, run in a thread.

No transaction stays open while the dispatcher waits on an agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from stortune.server.agentclient import BenchmarkOutcome, BenchmarkProgress
from stortune.server.services import benchmark_schedules, benchmarks, experiments
from stortune.server.services.benchmarks import ActiveRun

Sessions = sessionmaker[Session]


def active_runs(sessions: Sessions) -> tuple[list[ActiveRun], dict[str, str]]:
    """The queued and running runs, and host -> the experiment that owns it now."""
    with sessions() as session:
        return benchmarks.active_runs(session), experiments.owners(session)


def host_target(sessions: Sessions, host: str) -> tuple[str, dict[str, int]] | None:
    with sessions() as session:
        return benchmarks.host_target(session, host)


def mark_running(sessions: Sessions, run_id: str, progress: BenchmarkProgress,
                 profiles: Mapping[str, int], now: datetime) -> bool:
    with sessions() as session:
        return benchmarks.mark_running(session, run_id, progress, profiles, now)


def hold(sessions: Sessions, run_id: str) -> None:
    with sessions() as session:
        benchmarks.hold(session, run_id)


def postpone(sessions: Sessions, run_id: str, *, message: str, not_before: datetime,
          unreachable_since: datetime | None, now: datetime) -> None:
    with sessions() as session:
        benchmarks.postpone(session, run_id, message=message, not_before=not_before,
                         unreachable_since=unreachable_since, now=now)


def note(sessions: Sessions, run_id: str, *, message: str, unreachable_since: datetime | None,
         now: datetime) -> None:
    with sessions() as session:
        benchmarks.note(session, run_id, message=message, unreachable_since=unreachable_since, now=now)


def fail(sessions: Sessions, run_id: str, message: str, now: datetime) -> bool:
    with sessions() as session:
        return benchmarks.fail(session, run_id, message, now)


def write_progress(sessions: Sessions, run_id: str, progress: BenchmarkProgress,
                   now: datetime) -> bool | None:
    with sessions() as session:
        return benchmarks.write_progress(session, run_id, progress, now)


def conclude(sessions: Sessions, run_id: str, outcome: BenchmarkOutcome, now: datetime) -> bool:
    with sessions() as session:
        return benchmarks.conclude(session, run_id, outcome, now)


def forgotten(sessions: Sessions, run_id: str) -> None:
    with sessions() as session:
        benchmarks.forgotten(session, run_id)


def held(sessions: Sessions) -> list[tuple[str, str, str]]:
    """(run id, host, agent address) of ended runs the agents still keep."""
    with sessions() as session:
        found = [(run_id, host, benchmarks.host_target(session, host))
                 for run_id, host in benchmarks.held(session)]
        session.commit()
        out = []
        for run_id, host, target in found:
            if target is None:  # the host is gone, and its files with it as far as we can tell
                benchmarks.forgotten(session, run_id)
            else:
                out.append((run_id, host, target[0]))
        return out


def fire_due_schedules(sessions: Sessions, now: datetime) -> list[tuple[str, int]]:
    """(schedule, runs queued) for each schedule fired now."""
    fired = []
    with sessions() as session:
        for schedule in benchmark_schedules.due(session, now):
            rows = benchmark_schedules.fire(session, schedule, now)
            fired.append((schedule.name, len(rows)))
    return fired
