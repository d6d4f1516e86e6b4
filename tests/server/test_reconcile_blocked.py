"""A setting a device refuses blocks only itself: the host's other settings are still applied
and kept, and the error shows on the host's conditions and events (issue 26, point 9). As data."""

from __future__ import annotations

from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.server.reconciler.report import Outcome, conclude
from tests.server.test_reconcile_decide import (
    applied_result,
    decision_for,
    profile,
    seen,
    topology,
    view,
)


def _profiles() -> tuple[StorageProfile, StorageProfile]:
    bad = profile(scheduler="bfq-turbo").model_copy(deep=True)
    bad.metadata.name = "bad"
    return bad, profile()  # "streaming": read_ahead_kb 4096


REACHABLE = {"Reachable": {"status": "True", "reason": "AgentRegistered", "message": ""}}
ERROR = ("1 setting cannot be set (every other setting is applied): loop0 scheduler=bfq-turbo"
         " (bad/loops): scheduler 'bfq-turbo' is not offered by this kernel for this device;"
         " offered: none, mq-deadline")


def test_hostile_a_refused_value_in_one_profile_does_not_stop_correcting_another() -> None:
    profiles = _profiles()
    applied = {"bad": 1, "streaming": 1}
    v = view(profiles, applied, previous=plan(list(profiles), topology(4096)), conditions=REACHABLE)
    d = decision_for(v, 128)  # read_ahead_kb changed by hand since
    assert [r.tunable for r in d.rejected] == ["scheduler"]
    assert d.apply and [x.tunable for x in d.new_drift] == ["read_ahead_kb"]

    update = conclude(v, seen(topology(128)), d, Outcome(result=applied_result(v, topology(4096))))
    assert update.conditions["Applied"] == ("False", "Rejected", ERROR)
    assert update.conditions["Drifted"] == ("False", "NoDrift", "")
    assert [(e.type, e.reason) for e in update.events] == [
        ("Normal", "Applied"), ("Normal", "Corrected"), ("Warning", "Rejected")]
    assert update.applied == applied
    table = {s.tunable: s for s in update.devices or v.devices}
    assert table["scheduler"].message.startswith("rejected: scheduler 'bfq-turbo' is not offered")
    assert table["scheduler"].profile == "bad" and table["read_ahead_kb"].inSync


def test_hostile_a_new_profile_with_a_refused_value_is_sent_for_the_rest() -> None:
    v = view(_profiles(), {}, conditions=REACHABLE)
    d = decision_for(v, 128)
    assert d.apply and d.generations == {"bad": 1, "streaming": 1}


def test_in_sync_but_for_a_refused_value_reports_it_without_an_apply() -> None:
    profiles = _profiles()
    v = view(profiles, {"bad": 1, "streaming": 1}, previous=plan(list(profiles), topology(4096)),
             conditions=REACHABLE)
    d = decision_for(v, 4096)
    assert not d.apply
    update = conclude(v, seen(topology(4096)), d, None)
    assert update.conditions["Applied"] == ("False", "Rejected", ERROR)
    assert [(e.type, e.reason) for e in update.events] == [("Warning", "Rejected")]
