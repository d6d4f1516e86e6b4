"""The rollouts' gauges: hosts per stage of each profile's rollout, and whether it is halted.

A scrape must not cost a query per profile or per host: the rollouts table is read in one
query, and only when the resourceVersion counter moved since the last read (every write of a
rollout bumps it), or after ``every`` seconds whatever the counter says (a write that missed the
bump is seen late, never for ever). Each profile's lines are kept with its row's ``version``
and generation (a new rollout may start its version afresh) and formatted again only when
either moved.

``stortune_rollout_hosts{profile,phase}`` counts the rollout's hosts by their stage (the label
is called phase as in OpenShift's pool counts, one number per phase of a host); every stage
the machine knows is written, 0 included, so ``sum by (phase)`` and a dashboard's stacked bars
never miss a series. ``stortune_rollout_halted{profile}`` is 1 while the rollout is Halted,
and ``stortune_rollout_info{profile,phase,reason}`` carries the strings (kube-state-metrics'
``_info``): the alert rule tells a halt by failure from one a person asked for (Undone) by it.
A Complete rollout stays until the profile's next change, as its status stays readable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.rollout.machine import Stage
from stortune.server.db.tables import Rollout
from stortune.server.metrics.exposition import escape
from stortune.server.services.versions import current_resource_version

STAGES: tuple[str, ...] = get_args(Stage)
#: (name, help), all gauges, in the order they are written.
FAMILIES = (
    ("stortune_rollout_hosts",
     "Hosts of each profile's rollout by their stage (the phase label): pending, baseline, changing, "
     "analysing, updated, failed, reverting, reverted"),
    ("stortune_rollout_halted",
     "1 while the profile's rollout is Halted (a failure limit, a failed analysis or an undo), else 0"),
    ("stortune_rollout_info",
     "A profile's rollout: its phase and the reason of a halt (empty when none); always 1"),
)
_COLUMNS = (Rollout.profile, Rollout.generation, Rollout.version, Rollout.phase, Rollout.state)


def stage_counts(state: Mapping[str, Any]) -> dict[str, int]:
    """Hosts per stage from the stored state's JSON, every known stage present.

    Read from the JSON rather than through the machine's model: a scrape of thousands of hosts
    should not validate each, and a row it cannot read counts nothing instead of failing the
    scrape. A stage this code does not know (a newer server wrote it) is counted under its name."""
    counts = dict.fromkeys(STAGES, 0)
    hosts = state.get("hosts")
    if isinstance(hosts, dict):
        for host in hosts.values():
            stage = host.get("stage", "pending") if isinstance(host, dict) else None
            if isinstance(stage, str):
                counts[stage] = counts.get(stage, 0) + 1
    return counts


def rollout_lines(profile: str, phase: str, state: Mapping[str, Any]) -> tuple[str, str, str]:
    """This rollout's lines of each family in FAMILIES, in that order."""
    who = f'profile="{escape(profile)}"'
    hosts = "".join(f'stortune_rollout_hosts{{{who},phase="{escape(stage)}"}} {n}\n'
                    for stage, n in stage_counts(state).items())
    reason = state.get("reason")
    info = (f'stortune_rollout_info{{{who},phase="{escape(phase)}",'
            f'reason="{escape(reason if isinstance(reason, str) else "")}"}} 1\n')
    return hosts, f"stortune_rollout_halted{{{who}}} {int(phase == 'Halted')}\n", info


class RolloutGauges:
    """The rollouts' lines, read again when the resourceVersion counter moved."""

    def __init__(self, sessions: sessionmaker[Session] | None, *, every: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._every = every
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._version = -1
        self._at = float("-inf")
        #: profile -> ((its row's generation, version), its lines)
        self._kept: dict[str, tuple[tuple[int, int], tuple[str, str, str]]] = {}
        #: How many times the table was read (what the tests count instead of queries).
        self.reads = 0

    def refresh(self) -> None:
        if self._sessions is None:
            return
        with self._lock, self._sessions() as session:
            now = self._monotonic()
            version = current_resource_version(session)
            if version == self._version and now - self._at < self._every:
                return
            kept, fresh = self._kept, {}
            for profile, generation, row_version, phase, state in session.execute(select(*_COLUMNS)):
                entry = kept.get(profile)
                if entry is None or entry[0] != (generation, row_version):
                    lines = rollout_lines(profile, phase, state if isinstance(state, dict) else {})
                    entry = ((generation, row_version), lines)
                fresh[profile] = entry
            self._kept = fresh  # rollouts gone with their profile fall out here
            self._version, self._at = version, now
            self.reads += 1

    def render(self) -> str:
        kept = self._kept  # replaced, never changed in place
        ordered = [kept[p][1] for p in sorted(kept)]
        parts: list[str] = []
        for i, (name, text) in enumerate(FAMILIES):
            parts.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n")
            parts.extend(lines[i] for lines in ordered)
        return "".join(parts)
