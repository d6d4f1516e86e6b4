"""Each host's latest run of each benchmark against its baseline: what /metrics says of regressions.

A baseline (services/benchmark_baselines.py) is the reference run for a class of hosts;
``GET /benchmarks/runs/{id}/judgement`` judges one run against it on request. An alert needs
the verdict of the latest run of every (benchmark, host) all the time, so it is kept here:
judged once per new latest run (or a new baseline), by the same judge and noise rule, and
read from memory by every scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.bench import judge
from stortune.server.db.tables import BenchmarkRun
from stortune.server.services import benchmark_baselines, benchmarks


@dataclass(frozen=True)
class Verdict:
    benchmark: str
    host: str
    baseline: str
    run_id: str
    #: Objective metrics worse than the baseline's beyond the noise.
    worse: int

    @property
    def regressed(self) -> bool:
        return self.worse > 0


class Regressions:
    """Verdicts by (benchmark, host), refreshed at most every ``every`` seconds."""

    def __init__(self, sessions: sessionmaker[Session] | None, *, every: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._every = every
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._at = float("-inf")
        #: (benchmark, host) -> ((run id, baseline run id), verdict): judged again only when either moves.
        self._judged: dict[tuple[str, str], tuple[tuple[str, str], Verdict]] = {}
        self.verdicts: tuple[Verdict, ...] = ()

    def refresh(self) -> None:
        if self._sessions is None:
            return
        with self._lock:
            now = self._monotonic()
            if now - self._at < self._every:
                return
            self._at = now
            with self._sessions() as session:
                self._judged = self._judge_latest(session)
            self.verdicts = tuple(v for _, v in sorted(self._judged.values(), key=lambda e: e[0]))

    def _judge_latest(self, session: Session) -> dict[tuple[str, str], tuple[tuple[str, str], Verdict]]:
        latest = (select(func.max(BenchmarkRun.seq)).where(BenchmarkRun.state == "done",
                                                             BenchmarkRun.experiment.is_(None))
                  .group_by(BenchmarkRun.name, BenchmarkRun.host))
        judged: dict[tuple[str, str], tuple[tuple[str, str], Verdict]] = {}
        for run in session.scalars(select(BenchmarkRun).where(BenchmarkRun.seq.in_(latest))):
            baseline = benchmark_baselines.for_run(session, run)
            if baseline is None:
                continue
            key, ids = (run.name, run.host), (run.id, baseline.run_id)
            kept = self._judged.get(key)
            if kept is not None and kept[0] == ids:
                judged[key] = kept
                continue
            base_row = session.scalars(select(BenchmarkRun).where(BenchmarkRun.id == baseline.run_id)).first()
            result = benchmarks.result_of(run)
            base = benchmarks.result_of(base_row) if base_row is not None else None
            if result is None or base is None:
                continue
            worse = len(judge.judge(base, result).regressions)
            judged[key] = (ids, Verdict(run.name, run.host, baseline.name, run.id, worse))
        return judged
