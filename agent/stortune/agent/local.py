"""The agent's operations on this host, shared by the CLI, the daemon and the RPC service.

Each operation re-reads the kernel (discovery) and re-plans with the shared
pure planner; nothing is cached between calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stortune.agent import discovery, executor, journal, sources
from stortune.agent.kernelfs import KernelFS
from stortune.schemas import planner
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.plan import Plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Topology, TunableState


class AgentError(RuntimeError):
    """An operation that cannot proceed; the message says why and what to do."""


class ReportRow(BaseModel):
    device: str
    tunable: str
    before: int | str | None = None
    after: int | str | None = None
    status: str
    message: str = ""


class Report(BaseModel):
    title: str
    ok: bool
    rows: list[ReportRow] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Planned:
    topology: Topology
    plan: Plan


def read_profiles(paths: Sequence[str]) -> list[StorageProfile]:
    return sources.read_profiles(paths)


def discover(fs: KernelFS) -> Topology:
    return discovery.discover(fs)


def plan(fs: KernelFS, profiles: Sequence[StorageProfile]) -> Planned:
    topo = discover(fs)
    return Planned(topo, planner.plan(profiles, topo))


def observed(fs: KernelFS) -> tuple[dict[str, dict[str, TunableState]], str]:
    """Current tunable values per device (and "host"), plus the structure hash."""
    topo = discover(fs)
    return planner.observed_of(topo), topo.structure_hash()


def host_info(fs: KernelFS) -> dict[str, str]:
    def first_line(rel: str) -> str:
        text = fs.read_proc(rel)
        return text.strip() if text else ""

    return {
        "hostname": first_line("sys/kernel/hostname"),
        "kernel": first_line("sys/kernel/osrelease"),
        "boot_id": first_line("sys/kernel/random/boot_id"),
    }


def recover(fs: KernelFS, state_dir: Path) -> str | None:
    """Finish a transaction a crash left open; what was done, or None."""
    result = executor.recover(fs, state_dir, identify=_identify(fs))
    return result.summary() if result is not None else None


def _identify(fs: KernelFS) -> executor.Identify:
    def identify(name: str) -> str | None:
        return discovery.device_id(fs, name)

    return identify


def _rows(results: Sequence[executor.ChangeResult]) -> list[ReportRow]:
    return [
        ReportRow(device=r.device, tunable=r.tunable, before=r.before,
                  after=r.after if r.after is not None else r.desired, status=r.status,
                  message=r.message)
        for r in results
    ]


def converge(
    fs: KernelFS,
    profiles: Sequence[StorageProfile],
    state_dir: Path,
    generations: Mapping[str, int] | None = None,
) -> Report:
    """Make the host match exactly ``profiles`` (the agent's whole desired state).

    What they want is applied; what stortune changed earlier and no profile
    wants any more is put back to its recorded original. Any fatal rejection
    refuses everything. Orphans are restored first and the host is re-read
    before applying, because restoring a scheduler resets nr_requests.
    """
    recover(fs, state_dir)
    planned = plan(fs, profiles)
    fatal = planned.plan.fatal
    if fatal:
        return Report(
            title="apply refused: nothing was changed",
            ok=False,
            rows=[ReportRow(device=r.device, tunable=r.tunable, after=r.value, status="rejected",
                            message=r.reason) for r in fatal],
            messages=[f"{r.source.profile}/{r.source.rule}: {r.device} {r.tunable}={r.value!r}:"
                      f" {r.reason}" for r in fatal],
        )
    wanted = {(d.device_id, d.tunable) for d in planned.plan.desired}
    orphans = {k for k in journal.load_originals(state_dir) if k not in wanted}
    rows: list[ReportRow] = []
    messages: list[str] = []
    if orphans:
        restored = executor.restore(fs, state_dir, only=orphans, identify=_identify(fs))
        rows += _rows(restored.results)
        messages += restored.messages
        if not restored.ok:
            return Report(title="apply failed: could not restore settings no longer wanted",
                          ok=False, rows=rows, messages=messages)
        planned = plan(fs, profiles)
    result = executor.apply(fs, planned.plan.enforced(), state_dir, identify=_identify(fs))
    rows += _rows(result.results)
    messages += result.messages
    if result.ok:
        journal.save_desired(state_dir, {
            "profiles": [p.document() for p in profiles],
            "generations": dict(generations or {}),
        })
    messages += [f"skipped {r.device} {r.tunable}: {r.reason}"
                 for r in planned.plan.rejections if not r.fatal]
    changed = sum(r.status in ("applied", "restored") for r in rows)
    title = f"apply: {changed} setting(s) changed" if result.ok else "apply failed: rolled back"
    return Report(title=title, ok=result.ok, rows=rows, messages=messages)


def apply(fs: KernelFS, profiles: Sequence[StorageProfile], state_dir: Path) -> Report:
    return converge(fs, profiles, state_dir)


def restore(fs: KernelFS, state_dir: Path,
            only: Collection[tuple[str, str]] | None = None) -> Report:
    """Recorded originals back (all, or the given (device_id, tunable) keys).

    Restoring everything also drops the stored desired state, so the daemon
    does not re-apply what was just undone.
    """
    recover(fs, state_dir)
    if only is None:
        journal.clear_desired(state_dir)
    result = executor.restore(fs, state_dir, only=only, identify=_identify(fs))
    return Report(title=f"restore: {len(result.results)} setting(s)", ok=result.ok,
                  rows=_rows(result.results), messages=list(result.messages))


@dataclass(frozen=True)
class DesiredState:
    profiles: list[StorageProfile]
    generations: dict[str, int]


def saved_desired(state_dir: Path) -> DesiredState | None:
    """The last desired state the agent applied, to re-apply after reboots and hot-plug."""
    data: Any = journal.load_desired(state_dir)
    if not data:
        return None
    try:
        profiles = [parse_profile(p, f"{state_dir}/desired") for p in data.get("profiles", [])]
    except DocumentError as exc:
        raise AgentError(f"stored desired state is unreadable: {exc}") from None
    return DesiredState(profiles, {str(k): int(v) for k, v in data.get("generations", {}).items()})
