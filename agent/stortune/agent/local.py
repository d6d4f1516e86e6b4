"""The agent's operations on this host, shared by the CLI, the daemon and the RPC service.

Each operation re-reads the kernel (discovery) and re-plans with the shared
pure planner; nothing is cached between calls. Values are reported with what
the journal recorded for them (``TunableState.original``), so every planner,
here and on the control plane, sees which settings a converge would put back.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stortune.agent import discovery, executor, journal, refusals, sources
from stortune.agent.kernelfs import KernelFS
from stortune.schemas import planner, stripecache
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.plan import Plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import RecordedOriginal, Topology, TunableState


class AgentError(RuntimeError):
    """An operation that cannot proceed; the message says why and what to do."""


class ReportRow(BaseModel):
    device: str
    tunable: str
    before: int | str | None = None
    after: int | str | None = None
    status: str
    message: str = ""
    profile: str | None = Field(default=None, exclude_if=lambda v: v is None,
                                description="status rejected: the profile that wants the value")


class Report(BaseModel):
    title: str
    ok: bool
    rows: list[ReportRow] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)

    @property
    def rejected(self) -> list[ReportRow]:
        """Settings the plan holds as errors (not written; everything else was applied)."""
        return [r for r in self.rows if r.status == "rejected"]


@dataclass(frozen=True)
class Planned:
    topology: Topology
    plan: Plan
    #: Recorded originals discovery found no value for (the device is gone, or the tunable is
    #: unknown to this version): (device_id, tunable); a converge reports them.
    unplaced: tuple[journal.OriginalKey, ...] = ()


def read_profiles(paths: Sequence[str]) -> list[StorageProfile]:
    return sources.read_profiles(paths)


def _attach(topo: Topology, originals: Mapping[journal.OriginalKey, journal.Original]
            ) -> tuple[journal.OriginalKey, ...]:
    """Put each recorded original on the tunable state it belongs to; the keys that have none."""
    if not originals:
        return ()
    states = {d.id: d.tunables for d in topo.devices}
    states[planner.host_device(topo).id] = topo.host_tunables
    unplaced: list[journal.OriginalKey] = []
    for key, o in originals.items():
        state = states.get(o.device_id, {}).get(o.tunable)
        if state is None:
            unplaced.append(key)
            continue
        state.original = RecordedOriginal(value=o.value, direct=o.direct, cause=o.cause,
                                          cause_left=o.cause_left)
    return tuple(sorted(unplaced))


def _discover(fs: KernelFS, state_dir: Path | None) -> tuple[Topology, tuple[journal.OriginalKey, ...]]:
    topo = discovery.discover(fs)
    # One read of the originals per discovery, whatever the number of devices.
    unplaced = _attach(topo, journal.load_originals(state_dir)) if state_dir is not None else ()
    return topo, unplaced


def discover(fs: KernelFS, state_dir: Path | None = None) -> Topology:
    """The topology; with ``state_dir``, each value changed by stortune carries its recorded original."""
    return _discover(fs, state_dir)[0]


def plan(fs: KernelFS, profiles: Sequence[StorageProfile], state_dir: Path | None = None, *,
         ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> Planned:
    """Discover and plan; without ``state_dir`` no original is known, so nothing is to be put back.

    ``ram_share``: a stripe_cache_size costing more of the host's RAM is refused. A value the
    kernel refused when last written here (``refusals``) is an error of the plan, like one the
    planner knows the device refuses."""
    topo, unplaced = _discover(fs, state_dir)
    result = planner.plan(profiles, topo, stripe_cache_ram_share=ram_share)
    if state_dir is not None:
        result = refusals.withhold(result, topo, refusals.load(state_dir), refusals.boot_id(fs))
    return Planned(topo, result, unplaced)


def observed(fs: KernelFS, state_dir: Path | None = None) -> tuple[dict[str, dict[str, TunableState]], str]:
    """Current tunable values per device (and "host"), plus the structure hash."""
    topo = discover(fs, state_dir)
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


def recover(fs: KernelFS, state_dir: Path, *, ram_share: float = stripecache.DEFAULT_RAM_SHARE
            ) -> str | None:
    """Finish what a crash left open; what was done, or None.

    First a transaction cut short (the journal), then an experiment killed
    before it put its device back: its trial values give way to the stored
    desired state (or to the originals when there is none), the way the
    experiment would have ended.
    """
    result = executor.recover(fs, state_dir, identify=_identify(fs))
    done = [result.summary()] if result is not None else []
    experiment = journal.abandoned_experiment(state_dir)
    if experiment is not None:
        desired = saved_desired(state_dir)
        report = _converge(fs, desired.profiles if desired else [], state_dir, remember=False,
                           ram_share=ram_share, asked_share=desired.ram_share if desired else None)
        if not report.ok:
            raise AgentError(f"experiment {experiment} was interrupted and putting its settings back"
                             f" failed: {'; '.join(report.messages) or report.title}")
        journal.settle_experiment(state_dir, experiment)
        done.append(f"experiment {experiment} was interrupted: its settings are back"
                    f" ({report.title})")
    return "; ".join(done) or None


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


def _written(r: executor.ChangeResult) -> bool:
    """Not a restore that found the value already in place (only its record was settled)."""
    return not (r.status == "restored" and r.before is not None and r.before == r.after)


def converge(
    fs: KernelFS,
    profiles: Sequence[StorageProfile],
    state_dir: Path,
    generations: Mapping[str, int] | None = None,
    *,
    overlay: Sequence[StorageProfile] = (),
    remember: bool = True,
    ram_share: float = stripecache.DEFAULT_RAM_SHARE,
    asked_share: float | None = None,
) -> Report:
    """Make the host match exactly ``profiles`` (the agent's whole desired state).

    What they want is applied; what stortune changed earlier and no profile
    wants any more is put back as the planner's restorations say (to its
    recorded original, or to what a write still wanted left). A fatal rejection
    is an error on its setting alone: reported (a "rejected" row), not written,
    and everything else is applied. Restorations come first and the host is
    re-read before applying, because restoring a scheduler resets nr_requests.
    Originals of devices that are gone are reported and kept.

    ``overlay`` profiles (an experiment's trial values) are applied with
    ``profiles`` but never stored as the desired state: a restart, hot-plug or
    the next converge without them puts everything back. ``remember=False``
    stores nothing (a converge that only puts things back). ``ram_share``: a
    stripe_cache_size costing more of the host's RAM is refused; ``asked_share``, the control
    plane's, can only make that smaller, and is stored with the desired state so that every
    re-apply of it (restart, hot-plug) holds to it too.
    """
    recover(fs, state_dir, ram_share=ram_share)
    return _converge(fs, profiles, state_dir, generations, overlay=overlay, remember=remember,
                     ram_share=ram_share, asked_share=asked_share)


def _converge(
    fs: KernelFS,
    profiles: Sequence[StorageProfile],
    state_dir: Path,
    generations: Mapping[str, int] | None = None,
    *,
    overlay: Sequence[StorageProfile] = (),
    remember: bool = True,
    ram_share: float = stripecache.DEFAULT_RAM_SHARE,
    asked_share: float | None = None,
) -> Report:
    wanted = [*profiles, *overlay]
    share = stripecache.tightest(ram_share, asked_share)
    planned = plan(fs, wanted, state_dir, ram_share=share)
    # Releases include originals already back in place: their records are settled too.
    releases = planner.releases(planned.plan, planned.topology)
    originals = {(r.device_id, r.tunable) for r in releases if r.to == "original"}
    originals.update(planned.unplaced)
    to_cause = {(r.device_id, r.tunable) for r in releases if r.to == "cause"}
    rows: list[ReportRow] = []
    messages: list[str] = []
    if originals or to_cause:
        restored = executor.restore(fs, state_dir, only=originals, to_cause=to_cause,
                                    identify=_identify(fs))
        rows += _rows([r for r in restored.results if _written(r)])
        messages += restored.messages
        if not restored.ok:
            return Report(title="apply failed: could not restore settings no longer wanted",
                          ok=False, rows=rows, messages=messages)
        planned = plan(fs, wanted, state_dir, ram_share=share)
    result = executor.apply(fs, planned.plan.enforced(), state_dir, identify=_identify(fs))
    rows += _rows(result.results)
    messages += result.messages  # the plan's errors among them
    if result.ok and remember:
        journal.save_desired(state_dir, DesiredState(list(profiles), dict(generations or {}),
                                                     asked_share).document())
    # The errors: written neither now nor by a re-apply, reported every time.
    errors = result.rejections
    rows += [ReportRow(device=r.device, tunable=r.tunable, after=r.value, status="rejected",
                       message=r.reason, profile=r.source.profile) for r in errors]
    messages += [f"skipped {r.device} {r.tunable}: {r.reason}"
                 for r in planned.plan.rejections if not r.fatal]
    changed = sum(r.status in ("applied", "restored") for r in rows)
    title = f"apply: {changed} setting(s) changed" if result.ok else "apply failed: rolled back"
    if errors:
        title += f"; {len(errors)} cannot be set (errors)"
    return Report(title=title, ok=result.ok, rows=rows, messages=messages)


def apply(fs: KernelFS, profiles: Sequence[StorageProfile], state_dir: Path, *,
          ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> Report:
    return converge(fs, profiles, state_dir, ram_share=ram_share)


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
    #: The control plane's stripe-cache share sent with them (None: none was sent).
    ram_share: float | None = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"profiles": [p.document() for p in self.profiles],
                               "generations": dict(self.generations)}
        if self.ram_share is not None:
            doc["stripe_cache_ram_share"] = self.ram_share
        return doc


def saved_desired(state_dir: Path) -> DesiredState | None:
    """The last desired state the agent applied, to re-apply after reboots and hot-plug."""
    data: Any = journal.load_desired(state_dir)
    if not data:
        return None
    try:
        profiles = [parse_profile(p, f"{state_dir}/desired") for p in data.get("profiles", [])]
    except DocumentError as exc:
        raise AgentError(f"stored desired state is unreadable: {exc}") from None
    share = data.get("stripe_cache_ram_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float)
                              or not 0 < share <= 1):
        raise AgentError(f"stored desired state is unreadable: stripe_cache_ram_share {share!r} is"
                         " not a share of RAM (more than 0 and at most 1)")
    return DesiredState(profiles, {str(k): int(v) for k, v in data.get("generations", {}).items()},
                        None if share is None else float(share))
