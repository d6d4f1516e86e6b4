"""The experiment driver's database side: one short transaction per call, run in a thread.

No transaction stays open while the driver waits on an agent or a benchmark run.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.server.db.tables import BenchmarkRun, ExperimentHost, ExperimentTrial
from stortune.server.reconciler import store as reconciler_store
from stortune.server.reconciler.decide import HostView
from stortune.server.services import benchmarks, experiments
from stortune.server.services.experiments import ActiveHost

Sessions = sessionmaker[Session]


def active_hosts(sessions: Sessions) -> list[ActiveHost]:
    with sessions() as session:
        return experiments.active_hosts(session)


def host_address(sessions: Sessions, host: str) -> str | None:
    with sessions() as session:
        found = benchmarks.host_target(session, host)
        return None if found is None else found[0]


def host_view(sessions: Sessions, host: str) -> HostView | None:
    """The host's desired profiles as the reconciler sees them."""
    return reconciler_store.load(sessions, host)


def busy_with_benchmark(sessions: Sessions, host: str) -> str | None:
    with sessions() as session:
        return experiments.busy_with_benchmark(session, host)


def claim(sessions: Sessions, experiment: str, host: str, *, device: str, baseline: Mapping[str, Any],
          originals: Mapping[str, Any], now: datetime) -> bool:
    with sessions() as session:
        return experiments.claim(session, experiment, host, device=device, baseline=baseline,
                                 originals=originals, now=now)


def host_row(sessions: Sessions, experiment: str, host: str) -> ExperimentHost | None:
    with sessions() as session:
        row = experiments.host_state(session, experiment, host)
        if row is not None:
            session.expunge(row)
        return row


def trials(sessions: Sessions, experiment: str, host: str) -> list[ExperimentTrial]:
    with sessions() as session:
        rows = experiments.trial_rows(session, experiment, host)
        for row in rows:
            session.expunge(row)
        return rows


def note(sessions: Sessions, experiment: str, host: str, message: str, now: datetime) -> None:
    with sessions() as session:
        experiments.note_host(session, experiment, host, message, now)


def open_trial(sessions: Sessions, experiment: str, host: str, *, index: int, point: Mapping[str, Any],
               purpose: str, run_id: str, spec: BenchmarkSpec, progress: Mapping[str, Any],
               now: datetime) -> bool:
    with sessions() as session:
        return experiments.open_trial(session, experiment, host, index=index, point=point, purpose=purpose,
                                      run_id=run_id, spec=spec, requested_by=f"experiment {experiment}",
                                      progress=progress, now=now)


def run_state(sessions: Sessions, run_id: str) -> tuple[BenchmarkRun | None, bool]:
    """(the trial's benchmark run, whether its experiment was asked to cancel)."""
    with sessions() as session:
        row = experiments.trial_run(session, run_id)
        cancel = row is not None and row.experiment is not None and experiments.cancel_requested(
            session, row.experiment)
        if row is not None:
            session.expunge(row)
        return row, cancel


def cancel_run(sessions: Sessions, run_id: str, now: datetime) -> None:
    with sessions() as session:
        benchmarks.cancel(session, run_id, now)


def cancel_requested(sessions: Sessions, experiment: str) -> bool:
    with sessions() as session:
        return experiments.cancel_requested(session, experiment)


def record_trial(sessions: Sessions, experiment: str, host: str, index: int, *, ok: bool,
                 measurement: Mapping[str, Any], message: str, outcome: Mapping[str, Any] | None,
                 progress: Mapping[str, Any], now: datetime) -> bool:
    with sessions() as session:
        return experiments.record_trial(session, experiment, host, index, ok=ok, measurement=measurement,
                                        message=message, outcome=outcome, progress=progress, now=now)


def refused_trial(sessions: Sessions, experiment: str, host: str, index: int, *, point: Mapping[str, Any],
                  purpose: str, run_id: str, measurement: Mapping[str, Any], message: str,
                  outcome: Mapping[str, Any] | None, progress: Mapping[str, Any], now: datetime) -> bool:
    with sessions() as session:
        return experiments.refused_trial(session, experiment, host, index, point=point, purpose=purpose,
                                         run_id=run_id, measurement=measurement, message=message,
                                         outcome=outcome, progress=progress, now=now)


def begin_restore(sessions: Sessions, experiment: str, host: str, *, message: str,
                  progress: Mapping[str, Any], now: datetime) -> None:
    with sessions() as session:
        experiments.begin_restore(session, experiment, host, message=message, progress=progress, now=now)


def release(sessions: Sessions, experiment: str, host: str, *, state: str, message: str,
            outcome: Mapping[str, Any] | None, now: datetime) -> None:
    with sessions() as session:
        experiments.release(session, experiment, host, state=state, message=message, outcome=outcome,
                            now=now)
