"""The pure planner: (desired profiles, topology, observed values) -> Plan.

Used unchanged by the agent (apply, plan, explain), the control plane (drift
and dry runs) and the CLI (diff), so all three always agree.

Precedence when several rules set one tunable on one device (documented in
docs/precedence.md):
  1. the profile with the higher ``spec.priority`` wins;
  2. at equal priority, the profile whose name sorts first wins;
  3. within one profile, the later rule wins (write general rules first and
     specific ones after, as in a stylesheet).
The winner is final: if its value cannot be set on the device, that is a
rejection; a losing rule's value is never used as a fallback.

A rejection blocks only its own setting and the settings of the same device
that depend on it (``catalog.depends_on``): every other setting is planned as
usual, so one value a device refuses never stops a host's other settings from
being applied and kept. A fatal rejection is an error to report (the CLI exits
1 on it); a non-fatal one is a setting that does not apply here, skipped.

Restorations: a tunable stortune changed (its observed state carries the
journal's ``original``) that no profile wants any more goes back to its
original. A value that changed only as a side effect of another write (the
scheduler resets nr_requests) stays while that write is still wanted: it is put
back together with it. A setting removed while such a cause stays goes back to
what the cause left, not to the original from before both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stortune.schemas import catalog, controllertunables, stripecache
from stortune.schemas.catalog import DeviceFacts, check_on_device
from stortune.schemas.matching import mismatch
from stortune.schemas.plan import (
    Change,
    Desired,
    DeviceExplanation,
    Plan,
    Rejection,
    Restoration,
    RuleVerdict,
    Source,
    Value,
)
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import HOST_TARGET, Device, DeviceKind, Topology, TunableState

Observed = Mapping[str, Mapping[str, TunableState]]


def host_device(topology: Topology) -> Device:
    """The pseudo-device that host-wide tunables are planned against."""
    return Device(
        name=HOST_TARGET,
        kind=DeviceKind.HOST,
        id=f"host:{topology.hostname or 'localhost'}",
        tunables=topology.host_tunables,
    )


def targets(topology: Topology) -> list[Device]:
    return [*topology.devices, host_device(topology)]


def observed_of(topology: Topology) -> dict[str, dict[str, TunableState]]:
    """Observed values as discovery saw them, keyed by device name then tunable."""
    return {d.name: dict(d.tunables) for d in targets(topology)}


def precedence(profiles: Sequence[StorageProfile]) -> list[StorageProfile]:
    """Profiles from strongest to weakest."""
    return sorted(profiles, key=lambda p: (-p.spec.priority, p.metadata.name))


@dataclass(frozen=True)
class _Candidate:
    rank: tuple[int, str, int]  # smaller is stronger
    value: Value
    source: Source

    def describe(self) -> str:
        return f"{self.source.profile}/{self.source.rule} (priority {self.source.priority})"


def _why_lost(loser: _Candidate, winner: _Candidate) -> str:
    if loser.source.priority != winner.source.priority:
        why = f"priority {winner.source.priority} > {loser.source.priority}"
    elif loser.source.profile != winner.source.profile:
        why = f"equal priority, profile name {winner.source.profile!r} sorts first"
    else:
        why = "a later rule of the same profile wins"
    return f"{loser.describe()} wanted {loser.value!r}: overridden by {winner.describe()}, {why}"


def _generation(profile: StorageProfile) -> int | None:
    return profile.metadata.generation


def _candidates(
    profiles: Sequence[StorageProfile], dev: Device
) -> tuple[dict[str, list[_Candidate]], list[RuleVerdict]]:
    by_tunable: dict[str, list[_Candidate]] = {}
    verdicts: list[RuleVerdict] = []
    for profile in precedence(profiles):
        for index, rule in enumerate(profile.spec.rules):
            why = mismatch(rule.match, dev)
            verdicts.append(
                RuleVerdict(
                    profile=profile.metadata.name,
                    rule=rule.name,
                    matched=why is None,
                    reason=why or "all criteria hold",
                )
            )
            if why is not None:
                continue
            source = Source(
                profile=profile.metadata.name,
                rule=rule.name,
                priority=profile.spec.priority,
                generation=_generation(profile),
                mode=profile.spec.mode,
            )
            rank = (-profile.spec.priority, profile.metadata.name, -index)
            for tunable, value in rule.values().items():
                by_tunable.setdefault(tunable, []).append(_Candidate(rank, value, source))
    return by_tunable, verdicts


def device_facts(dev: Device, state: TunableState | None, tunable: catalog.Tunable | None = None
                 ) -> DeviceFacts:
    """What ``check_on_device`` needs of one tunable on one device, as discovery reported it."""
    if state is None:
        why = "not reported by discovery"
        if tunable is not None and tunable.scope == "controller":
            why = ("not a hardware RAID volume of a controller the agent manages (no vendor tool"
                   " maps it to this disk)")
        return DeviceFacts(kind=dev.kind, supported=False, writable=False, unsupported_reason=why)
    return DeviceFacts(
        kind=dev.kind,
        supported=state.supported,
        writable=state.writable,
        choices=state.choices,
        maximum=state.maximum,
        unsupported_reason=state.reason,
    )


def _ram_cost(topology: Topology, dev: Device, tunable: str, value: Value,
              ram_share: float) -> tuple[str | None, str | None]:
    """(note, refusal) of a value that costs RAM: today the md stripe cache."""
    if tunable != "stripe_cache_size" or not isinstance(value, int) or dev.md is None:
        return None, None
    cost = stripecache.cost(topology, dev, value)
    return cost.describe(), cost.refusal(ram_share)


def _blocked(name: str, errors: Mapping[str, str]) -> catalog.Rejection | None:
    """An error when a tunable ``name`` depends on cannot be set on the device (planned earlier:
    dependencies come first in catalog order)."""
    for dep in catalog.depends_on(name):
        if dep in errors:
            return catalog.Rejection(f"{name} is blocked: it depends on {dep}, which cannot be set on"
                                     f" this device ({errors[dep]}); fix {dep} first")
    return None


def plan(
    profiles: Sequence[StorageProfile],
    topology: Topology,
    observed: Observed | None = None,
    *,
    stripe_cache_ram_share: float = stripecache.DEFAULT_RAM_SHARE,
) -> Plan:
    """Decide what must change. Pure: reads nothing but its arguments.

    ``stripe_cache_ram_share``: a stripe_cache_size costing more of the host's RAM is refused
    (fatal: a profile that would pin that much memory is wrong for this host)."""
    seen = observed if observed is not None else observed_of(topology)
    result = Plan()
    order = {t.name: t.order for t in catalog.ordered()}
    position: dict[str, int] = {}
    kinds: dict[str, DeviceKind] = {}
    for index, dev in enumerate(targets(topology)):
        position[dev.name] = index
        kinds[dev.name] = dev.kind
        by_tunable, verdicts = _candidates(profiles, dev)
        result.explanations.append(
            DeviceExplanation(device=dev.name, device_id=dev.id, kind=dev.kind, rules=verdicts)
        )
        errors: dict[str, str] = {}  # tunable -> why it cannot be set on this device
        for name in sorted(by_tunable, key=lambda n: order[n]):
            ranked = sorted(by_tunable[name], key=lambda c: c.rank)
            win = ranked[0]
            tunable = catalog.get(name)
            state = seen.get(dev.name, {}).get(name)
            rejected = _blocked(name, errors) or check_on_device(
                tunable, win.value, device_facts(dev, state, tunable))
            note, too_costly = _ram_cost(topology, dev, name, win.value, stripe_cache_ram_share)
            too_costly = too_costly or controllertunables.refusal(dev, name, win.value)
            if rejected is None and too_costly is not None:
                rejected = catalog.Rejection(too_costly, fatal=True)
            if rejected is not None:
                if rejected.fatal:
                    errors[name] = rejected.reason
                result.rejections.append(
                    Rejection(
                        device=dev.name, device_id=dev.id, tunable=name, value=win.value,
                        reason=rejected.reason, fatal=rejected.fatal, source=win.source,
                    )
                )
                continue
            current = state.value if state is not None else None
            in_sync = tunable.same(current, win.value)
            # configured as wanted, but the controller applies it only at the next boot
            effective = state.effective if state is not None else None
            pending = in_sync and effective is not None and not tunable.same(effective, win.value)
            result.desired.append(
                Desired(
                    device=dev.name, device_id=dev.id, tunable=name, desired=win.value,
                    observed=current, in_sync=in_sync, source=win.source,
                    overridden=[_why_lost(c, win) for c in ranked[1:] if c.value != win.value
                                or c.source != win.source],
                    note=note, pending_reboot=pending, effective=effective if pending else None,
                )
            )
            if not in_sync:
                result.changes.append(
                    Change(
                        device=dev.name, device_id=dev.id, kind=dev.kind, tunable=name,
                        current=current, desired=win.value, source=win.source,
                    )
                )
    # A wanted value already in place is written again after a change that resets it (switching
    # away from bfq turns a disabled writeback throttle back on); the executor re-reads each value
    # before writing, so it writes only when the reset did happen.
    changed = {(c.device, c.tunable) for c in result.changes}
    result.changes += [
        Change(device=d.device, device_id=d.device_id, kind=kinds[d.device], tunable=d.tunable,
               current=d.observed, desired=d.desired, source=d.source)
        for d in result.desired
        if d.in_sync and any((d.device, cause) in changed for cause in catalog.reset_by(d.tunable))
    ]
    result.changes.sort(key=lambda c: (order[c.tunable], position[c.device]))
    result.restorations = [
        r for r in _releases(result, topology, seen)
        if not catalog.get(r.tunable).same(r.current, r.desired)
    ]
    return result


def releases(result: Plan, topology: Topology, observed: Observed | None = None) -> list[Restoration]:
    """Every recorded original that converging to ``result``'s profiles lets go of.

    ``result.restorations`` plus those already in place (nothing to write, but
    the record is to be forgotten or, for ``to="cause"``, no longer counted as
    a setting of its own), so that a value nobody manages any more is never
    put back later. In catalog order, then device order.
    """
    return _releases(result, topology, observed if observed is not None else observed_of(topology))


def _releases(result: Plan, topology: Topology, seen: Observed) -> list[Restoration]:
    # Rejected winners are wanted too: a profile still claims a setting it cannot make (it
    # stays as it is, reported as an error, not put back under the profile), and a setting
    # skipped on this device (not applicable, absent) is no reason to undo it.
    wanted = {(d.device, d.tunable) for d in result.desired}
    wanted |= {(r.device, r.tunable) for r in result.rejections}
    out: list[Restoration] = []
    for dev in targets(topology):
        states = seen.get(dev.name, {})
        for name, state in states.items():
            rec = state.original
            if rec is None or (dev.name, name) in wanted or name not in catalog.CATALOG:
                continue
            causes = [c for c in catalog.reset_by(name)
                      if (dev.name, c) in wanted and (s := states.get(c)) is not None
                      and s.original is not None]
            if not causes:
                out.append(Restoration(device=dev.name, device_id=dev.id, tunable=name,
                                       current=state.value, desired=rec.value))
            elif rec.direct:
                cause = rec.cause if rec.cause in causes else causes[0]
                left = rec.cause_left if rec.cause_left is not None else rec.value
                out.append(Restoration(device=dev.name, device_id=dev.id, tunable=name,
                                       current=state.value, desired=left, to="cause", cause=cause))
            # else: only a side effect of a change still wanted; it goes back with that change
    order = {t.name: t.order for t in catalog.ordered()}
    position = {d.name: i for i, d in enumerate(targets(topology))}
    out.sort(key=lambda r: (order[r.tunable], position[r.device]))
    return out
