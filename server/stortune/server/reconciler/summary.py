"""A profile's status: how many hosts it selects and how far they got. Pure.

Counted from every host's stored standing in one pass over the fleet, not per
host reconcile, so its cost is one read per pass however many hosts change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stortune.server.db.tables import Profile
from stortune.server.services.hosts import Standing
from stortune.server.services.profiles import selector

LISTED = 20  # host names shown per list; the counts cover all of them


def summarize(profile: Profile, standings: Sequence[Standing]) -> dict[str, Any]:
    name, generation = profile.name, profile.generation
    holding = [s.name for s in standings if name in s.applied]
    if profile.deletion_timestamp is not None:
        return {"observedGeneration": generation, "phase": "Deleting",
                "hosts": {"restoring": len(holding)}, "restoringHosts": holding[:LISTED]}
    chosen = selector(profile.spec)
    matched = [s for s in standings if chosen is not None and chosen.matches(s.labels)]
    # A host that applied the rest but cannot set one of this profile's values has failed it.
    rejected = [s.name for s in matched if name in s.rejected]
    applied = [s.name for s in matched if s.applied.get(name) == generation and name not in s.rejected]
    failed = [s.name for s in matched if name in s.rejected or (
        s.applied.get(name) != generation
        and s.applied_condition is not None and s.applied_condition["status"] == "False")]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": "Applied" if len(applied) == len(matched) else "Failed" if failed else "Progressing",
        "hosts": {"matched": len(matched), "applied": len(applied), "failed": len(failed),
                  "pending": len(matched) - len(applied) - len(failed), "rejected": len(rejected)},
    }
    if failed:
        status["failedHosts"] = failed[:LISTED]
    if rejected:
        status["rejectedHosts"] = rejected[:LISTED]  # see their settings tables for which and why
    return status
