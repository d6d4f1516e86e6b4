"""What a reconcile writes: status and events from what it saw, decided and got back. Pure.

Only what changed is written (a condition equal to the stored one, a settings
table equal to the stored one, are left out), so an idle fleet's periodic
passes write nothing at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stortune.schemas.plan import Desired, Plan, Rejection
from stortune.schemas.planner import observed_of
from stortune.schemas.topology import HOST_TARGET, Topology, TunableState
from stortune.server.agentclient import (
    AgentBusy,
    AgentError,
    AgentRejected,
    AgentUnreachable,
    ApplyResult,
    HostInfo,
)
from stortune.server.models.hosts import REJECTED, ConditionStatus, DeviceSetting
from stortune.server.reconciler.decide import Decision, ExperimentHold, HostView, SettingKey
from stortune.server.services.events import EventType
from stortune.server.services.hosts import APPLIED, DRIFTED, REACHABLE, StatusEvent

Condition = tuple[ConditionStatus, str, str]  # status, reason, message
Observed = Mapping[str, Mapping[str, TunableState]]
_LISTED = 3  # settings named in a condition message; the settings table has them all
#: Applied=False while the agent refuses applies because a benchmark runs there: not a failure,
#: the apply goes once the run ends (settings must not change under a measurement).
WAITING = "WaitingForBenchmark"
_BENCHMARK_BUSY = re.compile(r"\bbusy: benchmark (\S+) running")
#: The agent's own experiment (``stortune-agent tune``) holds the host's settings.
_EXPERIMENT_BUSY = re.compile(r"\bbusy: experiment (\S+) running")


#: Applied=False while a tuning experiment owns the host's settings: its trials set them, so they
#: are not drift, and profile applies wait until it has put the host back.
EXPERIMENT_RUNNING = "ExperimentRunning"


def experiment_running(hold: ExperimentHold) -> Condition:
    return ("False", EXPERIMENT_RUNNING,
            f"experiment {hold.experiment} ({hold.name}) owns {_count(len(hold.owned), 'setting')} of this "
            "host: its trials set them, profile applies wait until it ends and puts the host back")


def held(view: HostView, hold: ExperimentHold) -> Update:
    """The agent is busy with a trial's benchmark: only say why nothing is applied."""
    update = Update(conditions=_changed(view, {APPLIED: experiment_running(hold)}))
    if update.conditions:  # once per change, not per pass
        update.events.append(StatusEvent("Normal", EXPERIMENT_RUNNING, experiment_running(hold)[2]))
    return update


@dataclass(frozen=True)
class Seen:
    """What the agent reported: at the start of the reconcile, and again after an apply."""

    info: HostInfo
    topology: Topology
    topology_hash: str
    observed: Observed
    topology_changed: bool = False
    #: The digest of the agent's answer these values came from (None: read from its topology).
    digest: str | None = None

    def current(self) -> Topology:
        """The topology with the observed values, as dry runs and diffs should plan against."""
        devices = [d.model_copy(update={"tunables": dict(self.observed.get(d.name, d.tunables))})
                   for d in self.topology.devices]
        host = dict(self.observed.get(HOST_TARGET, self.topology.host_tunables))
        return self.topology.model_copy(update={"devices": devices, "host_tunables": host})

    def stale(self, stored: Topology | None) -> bool:
        """Whether the stored topology's structure or values differ from what was seen."""
        return self.topology_changed or stored is None or observed_of(stored) != self.observed


@dataclass(frozen=True)
class Outcome:
    """What the executor got back from Apply: a result or an error."""

    result: ApplyResult | None = None
    error: AgentError | None = None


@dataclass
class Update:
    conditions: dict[str, Condition] = field(default_factory=dict)
    devices: tuple[DeviceSetting, ...] | None = None
    applied: dict[str, int] | None = None
    topology: tuple[Topology, str] | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    events: list[StatusEvent] = field(default_factory=list)
    #: Try again after the key's backoff (a transient failure).
    retry: bool = False
    #: The digest of the values an apply left, recorded as the agent's last report: the agent
    #: reports the same digest soon after, and that must not ask for another look.
    observed_digest: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.conditions or self.devices is not None or self.applied is not None
                    or self.topology is not None or self.fields or self.events)


def _changed(view: HostView, conditions: Mapping[str, Condition]) -> dict[str, Condition]:
    return {t: c for t, c in conditions.items() if view.condition(t) != c}


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _listing(items: Sequence[str]) -> str:
    more = len(items) - _LISTED
    return "; ".join(items[:_LISTED]) + (f"; and {more} more" if more > 0 else "")


# -- reachability ------------------------------------------------------------------
def unreachable(view: HostView, error: AgentError) -> Update:
    """The agent could not be asked (or answered with an error that is not about the request)."""
    if isinstance(error, AgentUnreachable):
        reason, message = "AgentUnreachable", f"{view.address}: {error.reason}"
        event = StatusEvent("Warning", "Unreachable", f"agent at {view.address} does not answer: "
                            f"{error.reason}")
    else:
        reason, message = "AgentError", error.message
        event = StatusEvent("Warning", "AgentError", message)
    update = Update(conditions=_changed(view, {REACHABLE: ("False", reason, message)}),
                    retry=error.retryable)
    previous = view.condition(REACHABLE)
    if previous is None or previous[:2] != ("False", reason):  # once per transition, not per retry
        update.events.append(event)
    return update


def _answered(view: HostView) -> tuple[dict[str, Condition], list[StatusEvent]]:
    previous = view.condition(REACHABLE)
    # Only a heartbeat ends an expired lease: were an answer over gRPC enough,
    # a host whose heartbeats fail would flip between the two every pass.
    if view.lease_expired or (previous is not None and previous[0] == "True"):
        return {}, []
    events = []
    if previous is not None and previous[0] == "False":
        events.append(StatusEvent("Normal", "Reachable", f"agent at {view.address} answers again"))
    return {REACHABLE: ("True", "AgentResponded", "")}, events


# -- profiles this version refuses ----------------------------------------------------------
#: Applied=False while a profile selecting the host is one an earlier version stored and this one
#: refuses: nothing is planned or applied there until it is replaced or deleted.
INVALID_PROFILE = "InvalidProfile"


def invalid_profiles(view: HostView) -> Update:
    listed = [f"{name}: {why}" for name, why in sorted(view.invalid.items())]
    message = (f"nothing applied: {_count(len(listed), 'profile')} selecting this host, stored by an "
               f"earlier version, not valid now ({_listing(listed)}); replace (PUT) or delete them")
    update = Update(conditions=_changed(view, {APPLIED: ("False", INVALID_PROFILE, message)}))
    if update.conditions:  # once per change, not per pass
        update.events.append(StatusEvent("Warning", INVALID_PROFILE, message))
    return update


# -- the settings table --------------------------------------------------------------
def rows(plan: Plan, observed: Observed, drifted: frozenset[SettingKey]) -> tuple[DeviceSetting, ...]:
    out = [
        DeviceSetting(
            device=d.device, deviceId=d.device_id, tunable=d.tunable, desired=d.desired,
            observed=d.observed, inSync=d.in_sync, profile=d.source.profile, rule=d.source.rule,
            mode=d.source.mode, generation=d.source.generation,
            drifted=not d.in_sync and (d.device_id, d.tunable) in drifted,
            pendingReboot=d.pending_reboot, effective=d.effective,
            message=d.note or (f"takes effect at the next reboot; {d.effective} until then"
                               if d.pending_reboot else ""),
        )
        for d in plan.desired
    ]
    for r in plan.rejections:
        state = observed.get(r.device, {}).get(r.tunable)
        out.append(DeviceSetting(
            device=r.device, deviceId=r.device_id, tunable=r.tunable, desired=r.value,
            observed=state.value if state is not None else None, profile=r.source.profile,
            rule=r.source.rule, mode=r.source.mode, generation=r.source.generation,
            message=(REJECTED if r.fatal else "skipped: ") + r.reason,
        ))
    return tuple(sorted(out, key=lambda s: (s.device, s.tunable)))


def _drifted(table: Sequence[DeviceSetting]) -> Condition:
    drifted = [s for s in table if s.drifted]
    if not drifted:
        return "False", "NoDrift", ""
    listed = [f"{s.device} {s.tunable} observed {s.observed}, desired {s.desired}" for s in drifted]
    return "True", "Drift", f"{_count(len(drifted), 'setting')} changed since applied: {_listing(listed)}"


def observed_drift(view: HostView, seen: Seen, decision: Decision) -> Update:
    """Recorded before acting on drift, so status shows it even if correcting it fails or hangs."""
    table = rows(decision.plan, seen.observed, decision.drifted)
    conditions, events = _answered(view)
    conditions[DRIFTED] = _drifted(table)
    events += [StatusEvent("Warning", "Drift", d.message, profile=d.source.profile)
               for d in decision.new_drift]
    return Update(conditions=_changed(view, conditions),
                  devices=table if table != view.devices else None, events=events)


# -- the verdict ------------------------------------------------------------------------
def _generations(generations: Mapping[str, int]) -> str:
    return ", ".join(f"{name} (generation {g})" for name, g in sorted(generations.items()))


def _in_place(plan: Plan, generations: Mapping[str, int]) -> Condition:
    if not generations:
        return "True", "NoProfiles", "no profile selects this host"
    message = _generations(generations)
    audit = sum(c.source.mode == "audit" for c in plan.changes)
    if audit:
        message += f"; {_count(audit, 'audit-mode setting')} differ (reported, not changed)"
    return "True", "Applied", message


def _rejections(rejected: Sequence[Rejection], *, rest_applied: bool = True) -> str:
    listed = [f"{r.device} {r.tunable}={r.value} ({r.source.profile}/{r.source.rule}): {r.reason}"
              for r in rejected]
    # An agent older than per-setting errors refuses the whole plan.
    rest = "every other setting is applied" if rest_applied else "nothing applied"
    return f"{_count(len(rejected), 'setting')} cannot be set ({rest}): {_listing(listed)}"


def _settled(plan: Plan, generations: Mapping[str, int], also: Sequence[Rejection] = ()) -> Condition:
    """Applied once the changes are made: True, or False naming the settings that cannot be set
    (``plan``'s errors and ``also``: the control plane's own, e.g. its stripe cache RAM share)."""
    errors = list({(r.device_id, r.tunable): r for r in [*also, *plan.fatal]}.values())
    if errors:
        return "False", "Rejected", _rejections(errors)
    return _in_place(plan, generations)


def _report_text(report: Mapping[str, Any]) -> str:
    messages = [str(m) for m in report.get("messages", [])]
    title = str(report.get("title", "apply failed"))
    return f"{title}: {_listing(messages)}" if messages else title


@dataclass
class _Verdict:
    applied: Condition | None = None  # None: leave the stored Applied condition as it is
    result: ApplyResult | None = None  # a successful apply
    retry: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    unreachable: AgentError | None = None


def _verdict(decision: Decision, outcome: Outcome | None) -> _Verdict:
    if decision.held_by is not None:
        return _Verdict(applied=experiment_running(decision.held_by))
    if decision.refused:
        return _Verdict()
    if outcome is None:
        return _Verdict(applied=_settled(decision.plan, decision.generations))
    refuse = {"refusedGenerations": decision.generations}
    error, result = outcome.error, outcome.result
    if isinstance(error, AgentUnreachable):
        return _Verdict(retry=True, unreachable=error)
    if isinstance(error, AgentBusy):
        tuning = _EXPERIMENT_BUSY.search(error.message)
        if tuning is not None:
            return _Verdict(applied=("False", EXPERIMENT_RUNNING, f"experiment {tuning.group(1)} runs on the "
                                     "host (stortune-agent tune): profile applies wait until it ends"),
                            retry=True)
        running = _BENCHMARK_BUSY.search(error.message)
        if running is None:  # another stortune process holds the state directory for a moment
            return _Verdict(retry=True)
        return _Verdict(applied=("False", WAITING, f"the apply waits for benchmark {running.group(1)} to "
                                 "end: settings do not change under a measurement"), retry=True)
    if isinstance(error, AgentRejected):
        return _Verdict(applied=("False", "Rejected", error.message), fields=refuse)
    if error is not None:
        return _Verdict(applied=("False", "ApplyFailed", error.message), retry=error.retryable)
    assert result is not None
    if result.ok:
        return _Verdict(applied=_settled(result.plan, result.applied_generations, decision.rejected),
                        result=result,
                        fields={"appliedBootId": result.info.boot_id, "checkedBootId": result.info.boot_id})
    if result.plan.fatal:  # an agent older than per-setting errors refused the whole plan
        return _Verdict(applied=("False", "Rejected", _rejections(result.plan.fatal, rest_applied=False)),
                        fields=refuse)
    return _Verdict(applied=("False", "ApplyFailed", _report_text(result.report)), retry=True)


def _stored_fields(view: HostView) -> dict[str, Any]:
    return {"checkedBootId": view.checked_boot_id, "appliedBootId": view.applied_boot_id,
            "refusedGenerations": None if view.refused is None else dict(view.refused)}


def conclude(view: HostView, seen: Seen, decision: Decision, outcome: Outcome | None) -> Update:
    """The status write that ends a reconcile in which the agent answered."""
    verdict = _verdict(decision, outcome)
    if verdict.unreachable is not None:
        update = unreachable(view, verdict.unreachable)
        conditions = dict(update.conditions)
    else:
        conditions, events = _answered(view)
        update = Update(events=events, retry=verdict.retry)
    if seen.stale(view.topology):
        update.topology = (seen.current(), seen.topology_hash)

    fields: dict[str, Any] = {"checkedBootId": seen.info.boot_id or view.checked_boot_id}
    if not decision.refused:
        fields["refusedGenerations"] = None  # cleared once the generations change
    fields.update(verdict.fields)
    stored = _stored_fields(view)
    update.fields = {k: v for k, v in fields.items() if stored[k] != v}

    plan, drifted = decision.plan, decision.drifted
    if verdict.result is not None:
        plan = verdict.result.plan
        still = {(d.device_id, d.tunable) for d in plan.desired if not d.in_sync}
        drifted = frozenset(drifted & still)  # audit-mode drift stays; enforced drift was corrected
        update.applied = dict(verdict.result.applied_generations)
        update.events += _applied_events(view, decision, verdict.result)
    table = rows(plan, seen.observed, drifted)
    if table != view.devices:
        update.devices = table
    conditions[DRIFTED] = _drifted(table)
    if verdict.applied is not None:
        conditions[APPLIED] = verdict.applied
    update.conditions = _changed(view, conditions)
    failed = update.conditions.get(APPLIED)
    if failed is not None and failed[0] == "False":  # once per change, not per retry
        # Waiting for a benchmark or an experiment is no failure.
        kind: EventType = "Normal" if failed[1] in (WAITING, EXPERIMENT_RUNNING) else "Warning"
        update.events.append(StatusEvent(kind, failed[1], failed[2]))
    return update


def corrected(decision: Decision, result: ApplyResult) -> list[Desired]:
    """The drifted settings a successful apply set back (a Corrected event and count each)."""
    return [want for want in result.plan.desired
            if want.in_sync and (want.device_id, want.tunable) in decision.drifted]


def _applied_events(view: HostView, decision: Decision, result: ApplyResult) -> list[StatusEvent]:
    generations = result.applied_generations
    title = str(result.report.get("title", "applied"))
    events = [StatusEvent("Normal", "Applied", f"{_generations(generations) or 'no profiles'}: {title} "
                          f"({'; '.join(decision.why)})")]
    for want in corrected(decision, result):
        events.append(StatusEvent(
            "Normal", "Corrected", f"{want.device} {want.tunable} set back to {want.desired} "
            f"({want.source.profile}/{want.source.rule}) by the control plane", profile=want.source.profile))
    for name in sorted(set(view.applied) - set(generations)):
        deleting = name in view.deleting
        why = "the profile is being deleted" if deleting else "it no longer selects this host"
        events.append(StatusEvent("Normal", "Restored", f"{view.name} restored the settings of {name}: {why}",
                                  profile=name, on_profile=deleting))
    return events
