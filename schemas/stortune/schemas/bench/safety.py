"""Why a benchmark may not write to a raw device: the checks a topology alone answers.

One function for the agent (before a run, and for ``stortune-agent bench --dry-run``) and
for the control plane's dry run (against the topology the host last reported), so a dry
run refuses what the run would. The agent adds what only the host can tell: the
signatures libblkid finds on the device (``stortune.agent.bench.signatures``).
"""

from __future__ import annotations

from collections.abc import Sequence

from stortune.schemas.bench.steps import WorkloadStep
from stortune.schemas.topology import Device


def writing_steps(steps: Sequence[WorkloadStep]) -> str:
    """The writing steps' names, a few of them, or "" when none writes."""
    names = [s.name for s in steps if s.writes]
    return ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")


def write_refusals(dev: Device, steps: Sequence[WorkloadStep], allow_destructive: bool) -> list[str]:
    """Every reason the writing ``steps`` may not run on the raw device ``dev`` (none: they may,
    as far as the topology tells)."""
    shown = writing_steps(steps)
    if not shown:
        return []
    reasons: list[str] = []
    if not allow_destructive:
        reasons.append(f"allowDestructive is not true and {shown} write to the raw device,"
                       " destroying its contents")
    if dev.read_only:
        reasons.append(f"{dev.name} is read-only")
    reasons += [f"{dev.name} is mounted at {m.mountpoint} ({m.fstype})" for m in dev.mounts]
    if dev.holders:
        reasons.append(f"{dev.name} has holders {', '.join(dev.holders)} (something is built on it)")
    if dev.partitions:
        reasons.append(f"{dev.name} has partitions {', '.join(dev.partitions)}")
    return reasons
