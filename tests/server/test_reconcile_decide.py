"""Deciding and reporting, as data: no database, no agent, no event loop."""

from __future__ import annotations

from typing import Any

from stortune.schemas.documents import parse_profile
from stortune.schemas.plan import Plan
from stortune.schemas.planner import observed_of, plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import RecordedOriginal, Topology
from stortune.server.agentclient import (
    AgentBusy,
    AgentRejected,
    AgentUnreachable,
    ApplyResult,
    HostInfo,
)
from stortune.server.reconciler.decide import REBOOTED, RUNTIME, Decision, HostView, decide
from stortune.server.reconciler.report import Outcome, Seen, conclude, rows, unreachable
from stortune.server.services.hosts import ready_from
from tests.server.builders import loop_topology, profile_doc

ADDRESS = "h1.example:7443"
KEY = ("name:loop0", "read_ahead_kb")


def profile(generation: int = 1, mode: str = "enforce", **settings: Any) -> StorageProfile:
    doc = profile_doc(settings=settings or {"read_ahead_kb": 4096})
    doc["metadata"]["generation"] = generation
    doc["spec"]["mode"] = mode
    return parse_profile(doc)


def info(boot_id: str = "boot-1") -> HostInfo:
    return HostInfo(hostname="h1", kernel="6.1.0", boot_id=boot_id)


def view(profiles: tuple[StorageProfile, ...], applied: dict[str, int], *,
         previous: Plan | None = None, drifted: frozenset[tuple[str, str]] = frozenset(),
         **extra: Any) -> HostView:
    """A host whose last look wrote the settings table of ``previous``."""
    topology = loop_topology()
    table = rows(previous, observed_of(topology), drifted) if previous is not None else ()
    return HostView(name="h1", address=ADDRESS, profiles=profiles, applied=applied, devices=table,
                    topology=topology, topology_hash=topology.structure_hash(),
                    checked_boot_id="boot-1", **extra)


def topology(read_ahead_kb: int) -> Topology:
    return loop_topology(read_ahead_kb=read_ahead_kb)


def seen(t: Topology, boot_id: str = "boot-1") -> Seen:
    return Seen(info(boot_id), t, t.structure_hash(), observed_of(t))


def decision_for(v: HostView, read_ahead_kb: int, boot_id: str = "boot-1") -> Decision:
    return decide(v, plan(v.profiles, topology(read_ahead_kb)), boot_id)


# -- decide ---------------------------------------------------------------------------------
def test_a_new_profile_is_applied_and_is_not_drift() -> None:
    d = decision_for(view((profile(),), {}), 128)
    assert d.apply and d.generations == {"streaming": 1}
    assert d.why == ("profiles changed: streaming added", "1 enforced setting(s) differ")
    assert not d.new_drift and not d.drifted


def test_a_value_to_put_back_is_a_reason_to_apply() -> None:
    """No profile or generation changed and every wanted value is in sync, but the agent reports
    a value stortune changed that no profile wants any more: only an apply puts it back."""
    p = profile(scheduler="none")
    t = topology(4096)
    t.devices[0].tunables["read_ahead_kb"].original = RecordedOriginal(value=128)
    d = decide(view((p,), {"streaming": 1}), plan([p], t), "boot-1")
    assert d.apply and d.why == ("1 setting(s) to restore",)


def test_in_sync_means_nothing_to_do() -> None:
    p = profile()
    synced = plan([p], topology(4096))
    d = decision_for(view((p,), {"streaming": 1}, previous=synced), 4096)
    assert not d.apply and not d.why and not d.new_drift


def test_a_setting_in_sync_at_this_generation_that_changed_is_drift() -> None:
    p = profile()
    d = decision_for(view((p,), {"streaming": 1}, previous=plan([p], topology(4096))), 128)
    assert d.apply and d.drifted == {KEY}
    (drift,) = d.new_drift
    assert drift.cause == RUNTIME
    assert drift.message == ("loop0 read_ahead_kb observed 128, desired 4096 (streaming/loops): "
                             "changed while the agent was running")


def test_drift_under_another_boot_id_is_blamed_on_the_reboot() -> None:
    p = profile()
    d = decision_for(view((p,), {"streaming": 1}, previous=plan([p], topology(4096))), 128, "boot-2")
    assert [x.cause for x in d.new_drift] == [REBOOTED]


def test_a_new_generation_is_not_drift() -> None:
    old, new = profile(1), profile(2, read_ahead_kb=8192)
    d = decision_for(view((new,), {"streaming": 1}, previous=plan([old], topology(4096))), 4096)
    assert d.apply and not d.new_drift and not d.drifted
    assert d.why[0] == "profiles changed: streaming generation 1 -> 2"


def test_audit_drift_persists_without_an_apply() -> None:
    p = profile(mode="audit")
    before = plan([p], topology(128))
    d = decision_for(view((p,), {"streaming": 1}, previous=before, drifted=frozenset({KEY})), 128)
    assert not d.apply and d.drifted == {KEY} and not d.new_drift  # reported once, counted while it lasts


def test_removed_profiles_are_applied_away() -> None:
    d = decision_for(view((), {"streaming": 1}), 4096)
    assert d.apply and d.generations == {} and d.why == ("profiles changed: streaming removed",)


def test_refused_generations_send_nothing() -> None:
    refused = decision_for(view((profile(),), {}, refused={"streaming": 1}), 128)
    assert not refused.apply and refused.refused
    changed = decision_for(view((profile(2),), {}, refused={"streaming": 1}), 128)
    assert changed.apply and not changed.refused


# -- report ---------------------------------------------------------------------------------
def applied_result(v: HostView, after: Topology, ok: bool = True, **report: Any) -> ApplyResult:
    return ApplyResult(ok=ok, report={"title": "apply: 1 setting(s) changed", "messages": [], **report},
                       plan=plan(v.profiles, after),
                       applied_generations=v.generations() if ok else {}, info=info(),
                       request_id="r", topology_hash=after.structure_hash())


def test_a_successful_correction() -> None:
    p = profile()
    v = view((p,), {"streaming": 1}, previous=plan([p], topology(4096)),
             conditions={"Reachable": {"status": "True", "reason": "AgentRegistered", "message": ""}})
    d = decision_for(v, 128)
    update = conclude(v, seen(topology(128)), d, Outcome(result=applied_result(v, topology(4096))))
    assert update.conditions == {"Applied": ("True", "Applied", "streaming (generation 1)"),
                                 "Drifted": ("False", "NoDrift", "")}
    assert [e.reason for e in update.events] == ["Applied", "Corrected"]
    assert update.devices is None  # the table is as it was before the drift
    assert update.fields == {"appliedBootId": "boot-1"} and not update.retry


def test_apply_failures_retry_only_when_transient() -> None:
    v = view((profile(),), {})
    d = decision_for(v, 128)
    busy = conclude(v, seen(topology(128)), d, Outcome(error=AgentBusy(ADDRESS, "locked")))
    assert busy.retry and "Applied" not in busy.conditions
    failed = conclude(v, seen(topology(128)), d, Outcome(result=applied_result(
        v, topology(128), ok=False, title="apply failed: rolled back", messages=["read back 128"])))
    assert failed.retry
    assert failed.conditions["Applied"] == (
        "False", "ApplyFailed", "apply failed: rolled back: read back 128")
    assert [(e.type, e.reason) for e in failed.events] == [("Warning", "ApplyFailed")]
    rejected = conclude(v, seen(topology(128)), d, Outcome(error=AgentRejected(ADDRESS, "bad profile")))
    assert not rejected.retry and rejected.conditions["Applied"] == ("False", "Rejected", "bad profile")
    assert rejected.fields["refusedGenerations"] == {"streaming": 1}


def test_unreachable_events_only_on_the_transition() -> None:
    error = AgentUnreachable(ADDRESS, "connection refused", "UNAVAILABLE")
    first = unreachable(view((), {}), error)
    assert first.retry and first.conditions == {
        "Reachable": ("False", "AgentUnreachable", f"{ADDRESS}: connection refused")}
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "Unreachable")]
    still = view((), {}, conditions={"Reachable": {
        "status": "False", "reason": "AgentUnreachable", "message": f"{ADDRESS}: deadline exceeded"}})
    again = unreachable(still, error)
    assert again.events == [] and again.retry  # the message may change; the event is not repeated


def test_ready_is_derived_from_the_other_three() -> None:
    def c(type: str, status: str, reason: str = "R", message: str = "") -> dict[str, str]:
        return {"type": type, "status": status, "reason": reason, "message": message}

    ok = [c("Reachable", "True"), c("Applied", "True"), c("Drifted", "False")]
    assert ready_from(ok) == ("True", "Reconciled", "")
    assert ready_from([c("Reachable", "True")]) == ("Unknown", "Reconciling",
                                                    "not known yet: Applied, Drifted")
    drifted = [*ok[:2], c("Drifted", "True", "Drift", "1 setting changed")]
    assert ready_from(drifted) == ("False", "Drift", "Drifted=True: 1 setting changed")
    lapsed = [c("Reachable", "False", "LeaseExpired", "no heartbeat since t"), *ok[1:]]
    assert ready_from(lapsed) == ("False", "LeaseExpired", "Reachable=False: no heartbeat since t")
