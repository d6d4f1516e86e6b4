"""A host's analysis on the control plane: where its limits are, from what it reported.

The topology is the one the agent last uploaded, the measured ceilings come from its
probes, and slow members and path balance from its latest finished benchmark runs. The
analysis itself is the pure one the agent and the CLI share (schemas/analysis).
"""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.schemas.analysis.host import host_analysis
from stortune.schemas.analysis.model import HostAnalysis
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.stripecache import DEFAULT_RAM_SHARE
from stortune.server.db.tables import BenchmarkRun
from stortune.server.errors import Conflict
from stortune.server.services import hosts, probes

#: Runs looked at for slow members and balance by default, and at most: enough for a
#: member to stand out in most of them, few enough to load on every request.
DEFAULT_RUNS = 10
MAX_RUNS = 50

def recent_results(session: Session, host: str, runs: int) -> list[BenchmarkResult]:
    """The host's latest finished runs' results, newest first (unreadable ones skipped)."""
    rows = session.scalars(select(BenchmarkRun.result)
                           .where(BenchmarkRun.host == host, BenchmarkRun.state == "done",
                                  BenchmarkRun.result.is_not(None))
                           .order_by(BenchmarkRun.seq.desc()).limit(runs))
    out: list[BenchmarkResult] = []
    for data in rows:
        try:
            out.append(BenchmarkResult.model_validate(data))
        except ValidationError:
            continue  # a result stored by an older version that no longer validates
    return out


def analyze(session: Session, name: str, *, runs: int = DEFAULT_RUNS,
            ram_share: float = DEFAULT_RAM_SHARE) -> HostAnalysis:
    row = hosts.get(session, name)
    if row.topology is None:
        raise Conflict(f"host {name!r} has not reported its topology yet: nothing to analyse")
    topology = hosts.stored_topology(row.topology)
    if topology is None:  # stored before the model's bounds: the agent's next report replaces it
        raise Conflict(f"host {name!r}'s stored topology no longer validates (stored by an older"
                       " server or agent); it is analysed once the agent reports it again")
    return host_analysis(topology, measured=probes.measured(session, name),
                         results=recent_results(session, name, runs), ram_share=ram_share)
