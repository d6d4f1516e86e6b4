"""A value a device refuses blocks only its own setting and those declared as depending on it
(issue 26, point 9): the plan as data."""

from __future__ import annotations

import dataclasses

import pytest

from stortune.schemas import catalog
from stortune.schemas.catalog import Tunable
from stortune.schemas.plan import Plan
from stortune.schemas.planner import observed_of, plan
from stortune.schemas.topology import DeviceKind, Topology
from tests.schemas.test_planner import profile, rule
from tests.schemas.topologies import streamer_with_md


def _profiles() -> list:  # type: ignore[type-arg]
    bad = profile("bad", 10, [rule("sched", "{name: [sda]}", "{scheduler: bfq-turbo}")])
    good = profile("good", 0, [rule("queue", "{name: [sda, sdb]}",
                                    "{nr_requests: 32, read_ahead_kb: 4096}")])
    return [bad, good]


def _rows(result: Plan) -> tuple[list[tuple[str, str, object]], list[tuple[str, str, object, bool]]]:
    return ([(c.device, c.tunable, c.desired) for c in result.changes],
            [(r.device, r.tunable, r.value, r.fatal) for r in result.rejections])


def _applied(topology: Topology, result: Plan) -> dict[str, dict]:  # type: ignore[type-arg]
    """The observed values once ``result``'s changes are made (nothing else moves)."""
    seen = observed_of(topology)
    for c in result.changes:
        seen[c.device][c.tunable] = seen[c.device][c.tunable].model_copy(update={"value": c.desired})
    return seen


def test_hostile_a_scheduler_not_offered_is_an_error_on_that_setting_alone() -> None:
    topology = streamer_with_md()
    result = plan(_profiles(), topology)
    changes, rejections = _rows(result)
    assert rejections == [("sda", "scheduler", "bfq-turbo", True)]
    assert "not offered" in result.rejections[0].reason
    assert result.rejections[0].source.profile == "bad"
    # nr_requests is coupled to the scheduler (a switch resets it), not dependent on it: planned.
    assert changes == [("sda", "nr_requests", 32), ("sdb", "nr_requests", 32),
                       ("sda", "read_ahead_kb", 4096), ("sdb", "read_ahead_kb", 4096)]
    # Applied, the plan is empty (apply, drift and diff agree) and the error is still reported.
    after = plan(_profiles(), topology, _applied(topology, result))
    assert after.empty and _rows(after)[1] == rejections
    assert all(d.in_sync for d in after.desired)


def test_hostile_a_setting_depending_on_a_blocked_one_is_blocked_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No tunable of today's catalog declares a dependency (scheduler parameters would): declare
    # one for this test, as a catalog entry would.
    nr = catalog.CATALOG["nr_requests"]
    monkeypatch.setitem(catalog.CATALOG, "nr_requests",  # type: ignore[index]
                        dataclasses.replace(nr, depends_on=("scheduler",)))
    profiles = [*_profiles(), profile("other", 5, [rule("s", "{name: [sdb]}", "{scheduler: bfq}")])]
    result = plan(profiles, streamer_with_md())
    changes, rejections = _rows(result)
    assert rejections == [("sda", "scheduler", "bfq-turbo", True), ("sda", "nr_requests", 32, True)]
    blocked = result.rejections[1]
    assert blocked.reason.startswith("nr_requests is blocked: it depends on scheduler")
    assert "not offered" in blocked.reason and blocked.source.profile == "good"
    # Its scheduler settable, sdb's nr_requests is planned; sda's other settings are too.
    assert changes == [("sdb", "scheduler", "bfq"), ("sdb", "nr_requests", 32),
                       ("sda", "read_ahead_kb", 4096), ("sdb", "read_ahead_kb", 4096)]


def test_a_dependency_must_be_declared_earlier_in_order() -> None:
    first = Tunable(name="a", path="queue/a", description="", order=1,
                    applies_to=frozenset({DeviceKind.DISK}))
    later = dataclasses.replace(first, name="b", path="queue/b", order=2, depends_on=("a",))
    assert catalog._declare(first, later)["b"].depends_on == ("a",)
    with pytest.raises(RuntimeError, match="b depends on c"):
        catalog._declare(first, dataclasses.replace(later, depends_on=("c",)))
    with pytest.raises(RuntimeError, match="a depends on b"):
        catalog._declare(dataclasses.replace(first, depends_on=("b",)), later)
