"""Deciding what a host needs: pure functions of what is stored and what its agent reports.

The planner says what differs; this module says what that means for the
control plane: whether to call Apply, which differences are drift (a setting
that was in sync at this profile generation and changed since), and why.
Nothing here does I/O, so every case is a plain unit test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stortune.schemas.plan import Plan, Rejection, Source, Value
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Topology
from stortune.server.models.hosts import DeviceSetting, holding_kernel_refusals, rebooted, same_want

#: (device id, tunable): stable across renames (sdb today, sdc after a reboot).
SettingKey = tuple[str, str]

REBOOTED = "reset since last check (host rebooted)"
RUNTIME = "changed while the agent was running"


@dataclass(frozen=True)
class ExperimentHold:
    """A tuning experiment owns these settings of the host: their values are its trials', not drift."""

    experiment: str
    name: str
    #: (device id, tunable) of every setting its trials change.
    owned: frozenset[SettingKey]


@dataclass(frozen=True)
class HostView:
    """One host as the database shows it, read in one short transaction."""

    name: str
    address: str
    #: Live profiles selecting the host, each with its generation.
    profiles: tuple[StorageProfile, ...]
    #: Profile name -> generation the agent last reported applied.
    applied: Mapping[str, int]
    #: Applied profiles that are being deleted (their finalizer waits on this host).
    deleting: frozenset[str] = frozenset()
    #: Condition type -> {status, reason, message, ...}.
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The settings table the last successful look wrote.
    devices: tuple[DeviceSetting, ...] = ()
    topology: Topology | None = None
    topology_hash: str | None = None
    checked_boot_id: str | None = None
    applied_boot_id: str | None = None
    refused: Mapping[str, int] | None = None
    lease_expired: bool = False
    #: The boot id the agent last reported (registration, heartbeats).
    boot_id: str | None = None
    #: Profiles selecting the host that this version refuses (stored by an earlier one): name -> why.
    #: Nothing is planned or applied while there are any.
    invalid: Mapping[str, str] = field(default_factory=dict)
    #: The tuning experiment that owns the host's settings now, if any (``ExperimentHold``).
    experiment: ExperimentHold | None = None

    def generations(self) -> dict[str, int]:
        """What the host should have applied: profile -> generation."""
        return {p.metadata.name: p.metadata.generation or 0 for p in self.profiles}

    def condition(self, type: str) -> tuple[str, str, str] | None:
        c = self.conditions.get(type)
        return None if c is None else (c["status"], c["reason"], c["message"])

    def with_status(self, conditions: Mapping[str, tuple[str, str, str]],
                    devices: tuple[DeviceSetting, ...] | None) -> HostView:
        """This view after a status write of ``conditions`` and ``devices``."""
        merged = dict(self.conditions)
        for type, (status, reason, message) in conditions.items():
            merged[type] = {"type": type, "status": status, "reason": reason, "message": message}
        return replace(self, conditions=merged, devices=self.devices if devices is None else devices)


@dataclass(frozen=True)
class Drift:
    """A setting that was in sync at this profile generation and is not any more."""

    device: str
    device_id: str
    tunable: str
    observed: Value | None
    desired: Value
    source: Source
    cause: str

    def describe(self) -> str:
        return (f"{self.device} {self.tunable} observed {_show(self.observed)}, desired {self.desired} "
                f"({self.source.profile}/{self.source.rule})")

    @property
    def message(self) -> str:
        return f"{self.describe()}: {self.cause}"


@dataclass(frozen=True)
class Decision:
    plan: Plan
    #: What an apply sends: profile -> generation.
    generations: dict[str, int]
    apply: bool
    #: Why an apply is needed (empty when it is not).
    why: tuple[str, ...]
    #: Settings that drifted since the last look (one event each).
    new_drift: tuple[Drift, ...]
    #: Every setting now counted as drifted: the new ones and, in audit mode, earlier ones.
    drifted: frozenset[SettingKey]
    #: The plan's errors (fatal rejections): settings that cannot be set. Each blocks only itself
    #: and its dependants; everything else is applied, and these are reported.
    rejected: tuple[Rejection, ...]
    #: The agent refused exactly these generations before; terminal until they change.
    refused: bool
    #: An experiment owns the host: nothing is applied until it ends (its id).
    held_by: ExperimentHold | None = None


def _show(value: Value | None) -> str:
    return "(unset)" if value is None else str(value)


def decide(view: HostView, plan: Plan, boot_id: str) -> Decision:
    """``plan`` is the planner's answer for ``view.profiles`` on what the agent reports now."""
    generations = view.generations()
    booted = rebooted(view.checked_boot_id, boot_id)
    cause = REBOOTED if booted else RUNTIME
    before = {(d.deviceId, d.tunable): d for d in view.devices}
    plan = holding_kernel_refusals(plan, view.devices, rebooted=booted)
    drifted: set[SettingKey] = set()
    new_drift: list[Drift] = []
    for want in plan.desired:
        key = (want.device_id, want.tunable)
        last = before.get(key)
        if want.in_sync or last is None or not same_want(last, want.source, want.desired):
            continue
        if last.inSync:
            new_drift.append(Drift(want.device, want.device_id, want.tunable, want.observed,
                                   want.desired, want.source, cause))
            drifted.add(key)
        elif last.drifted:
            drifted.add(key)
    rejected = tuple(plan.fatal)
    refused = view.refused is not None and dict(view.refused) == generations
    why: list[str] = []
    if generations != dict(view.applied):
        why.append(_profiles_changed(view.applied, generations))
    enforced = sum(c.source.mode == "enforce" for c in plan.changes)
    if enforced:
        why.append(f"{enforced} enforced setting(s) differ")
    if plan.restorations:
        # Values stortune changed that no profile wants any more: only an apply puts them back.
        why.append(f"{len(plan.restorations)} setting(s) to restore")
    return Decision(
        plan=plan, generations=generations, apply=bool(why) and not refused,
        why=tuple(why), new_drift=tuple(new_drift), drifted=frozenset(drifted), rejected=rejected,
        refused=refused,
    )


def _profiles_changed(applied: Mapping[str, int], wanted: Mapping[str, int]) -> str:
    parts = []
    for name in sorted({*applied, *wanted}):
        if name not in applied:
            parts.append(f"{name} added")
        elif name not in wanted:
            parts.append(f"{name} removed")
        elif applied[name] != wanted[name]:
            parts.append(f"{name} generation {applied[name]} -> {wanted[name]}")
    return "profiles changed: " + ", ".join(parts)


def hold(decision: Decision, experiment: ExperimentHold) -> Decision:
    """``decision`` while ``experiment`` owns the host: no apply (profile applies wait for its end),
    and the settings it owns are neither drift nor counted as drifted; drift elsewhere is still
    reported. The experiment puts the host back when it ends, then enforcement resumes."""
    new_drift = tuple(d for d in decision.new_drift if (d.device_id, d.tunable) not in experiment.owned)
    return replace(decision, apply=False, new_drift=new_drift,
                   drifted=frozenset(decision.drifted - experiment.owned), held_by=experiment)
