"""The rollout state machine, as data: simulated hosts execute its actions and report back."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stortune.schemas.rollout import machine, waves
from stortune.schemas.rollout.machine import (
    Advance,
    Event,
    Hold,
    HostObservation,
    Observed,
    Revert,
    RolloutState,
    StartAnalysis,
)
from tests.schemas.rollout.sim import Fleet, run, spec

STREAM = {"benchmark": {"preset": "stream-32k", "runtime": "10s"},
          "objectives": [{"metric": "read_bandwidth", "goal": "maximize"}]}


def hosts(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(n)]


def begin(n: int, **fields: Any) -> tuple[RolloutState, Fleet]:
    fleet = Fleet.of(hosts(n), generation=1)
    state, actions = machine.start("web", spec(**fields), 2, 1, hosts(n), now=0.0)
    fleet.execute(actions)
    return state, fleet


def events(fleet: Fleet, reason: str) -> list[str]:
    return [a.message for a in fleet.log if isinstance(a, Event) and a.reason == reason]


def in_order(state: RolloutState) -> list[str]:
    return [h for w in waves.deal("web", state.hosts, waves.waves_of(state.spec)) for h in w]


# -- failures, halts and rollbacks (hostile first) --------------------------------------
def _failing(n_failing: int) -> tuple[RolloutState, Fleet]:
    state, fleet = begin(20, waves=[{"hosts": 5}, {"percent": 100}], maxUnavailable=5, maxFailures=2)
    wave1 = in_order(state)[:5]
    fleet.fails = dict.fromkeys(wave1[:n_failing], "apply-failed")
    return run(state, fleet), fleet


def test_hostile_failures_at_max_failures_do_not_halt() -> None:
    state, fleet = _failing(2)
    assert state.phase == "Complete" and state.failures == 2
    assert machine.counts(state)["failed"] == 2 and machine.counts(state)["updated"] == 18
    assert not [a for a in fleet.log if isinstance(a, Revert)]


def test_hostile_one_failure_past_max_failures_halts_and_rolls_back_the_changed_hosts() -> None:
    state, fleet = _failing(3)
    assert (state.phase, state.reason) == ("Halted", "FailureLimit") and state.rollback and state.rolledBack
    wave1 = in_order(state)[:5]
    assert sorted(fleet.advanced()) == sorted(wave1), "no host of wave 2 was touched"
    reverted = sorted(a.host for a in fleet.log if isinstance(a, Revert))
    assert reverted == sorted(wave1) and {a.generation for a in fleet.log if isinstance(a, Revert)} == {1}
    assert set(fleet.held.values()) == {1}
    assert events(fleet, "RolledBack")
    assert "3 hosts failed, more than maxFailures 2" in events(fleet, "Halted")[0]


def test_hostile_the_first_failure_halts_with_the_default_max_failures_of_zero() -> None:
    state, fleet = begin(30)
    fleet.fails = {in_order(state)[0]: "blocked"}
    state = run(state, fleet)
    assert (state.phase, state.reason, state.rolledBack) == ("Halted", "FailureLimit", True)
    assert fleet.advanced() == [in_order(state)[0]]


@pytest.mark.parametrize("kind", ["unreachable", "drift"])
def test_hostile_a_host_that_fails_after_its_update_during_the_soak_fails_the_wave(
        kind: machine.FailureKind) -> None:
    state, fleet = begin(10, soak="5m")
    canary = in_order(state)[0]
    state = run(state, fleet, tick=10.0, steps=5)
    assert state.wave == 0 and state.hosts[canary].stage == "updated" and state.soakSince is not None
    fleet.fails = {canary: kind}
    state = run(state, fleet, tick=10.0)
    assert (state.phase, state.reason) == ("Halted", "FailureLimit")
    assert fleet.advanced() == [canary]


def test_a_wave_waits_for_its_soak_and_an_unhealthy_host_restarts_it() -> None:
    state, fleet = begin(10, soak="1m")
    canary = in_order(state)[0]
    state = run(state, fleet, now=0.0, tick=20.0, steps=3)  # updated and soaking from t=0; t=40 < 1m
    assert state.wave == 0 and state.soakSince == 0.0
    fleet.unhealthy = {canary}
    state = run(state, fleet, now=60.0, tick=20.0, steps=1)
    assert state.soakSince is None and state.wave == 0 and not events(fleet, "WavePassed")
    fleet.unhealthy = set()
    state = run(state, fleet, now=80.0, tick=20.0, steps=3)  # soaking again from t=80: not passed at t=120
    assert state.wave == 0 and state.soakSince == 80.0
    state = run(state, fleet, now=140.0, tick=20.0, steps=1)
    # Wave 2 (10% of 10 is the canary again) has no hosts of its own: skipped, no soak.
    assert state.wave == 2 and events(fleet, "WavePassed") == ["wave 1 of 3 passed (1 hosts)"]
    assert events(fleet, "WaveSkipped") == ["wave 2 of 3 has no hosts of its own"]


def test_hostile_onfailure_pause_halts_without_reverting_and_resume_excuses_the_failures() -> None:
    state, fleet = begin(12, onFailure="pause")
    canary = in_order(state)[0]
    fleet.fails = {canary: "apply-failed"}
    state = run(state, fleet)
    assert (state.phase, state.reason, state.rollback) == ("Halted", "FailureLimit", False)
    assert not [a for a in fleet.log if isinstance(a, Revert)]
    state = run(state, fleet, commands=lambda i, s: ("resume",) if i == 0 else ())
    assert state.phase == "Complete" and state.excused == 1
    assert sorted(fleet.advanced()) == sorted(hosts(12))


# -- analysis ----------------------------------------------------------------------------
def test_hostile_a_canary_that_regresses_halts_after_it_rolls_it_back_and_never_touches_another() -> None:
    """The loop-device scenario of issue 27, as data: read_ahead_kb 4096 -> 0 under stream-32k."""
    state, fleet = begin(2, analysis=STREAM, maxFailures=1)
    canary, other = in_order(state)
    assert fleet.log[1:] == [StartAnalysis(canary, "before")]
    fleet.verdicts = {canary: "failed"}
    state = run(state, fleet)
    assert (state.phase, state.reason, state.rolledBack) == ("Halted", "AnalysisFailed", True)
    actions = [a for a in fleet.log if not isinstance(a, Event)]
    assert actions == [StartAnalysis(canary, "before"), Advance(canary, 2), StartAnalysis(canary, "after"),
                       Revert(canary, 1)]
    assert fleet.held == {canary: 1, other: 1}
    assert state.hosts[canary].verdict == "failed"


def test_an_improving_canary_lets_the_rollout_complete_and_only_the_gated_wave_is_benchmarked() -> None:
    state, fleet = begin(20, analysis=STREAM)
    state = run(state, fleet)
    assert state.phase == "Complete" and set(fleet.held.values()) == {2}
    benchmarked = {a.host for a in fleet.log if isinstance(a, StartAnalysis)}
    assert benchmarked == set(in_order(state)[:1])


def test_every_gated_wave_is_benchmarked() -> None:
    state, fleet = begin(20, analysis={**STREAM, "waves": [1, 2]}, maxUnavailable=2)
    state = run(state, fleet)
    assert state.phase == "Complete"
    assert {a.host for a in fleet.log if isinstance(a, StartAnalysis)} == set(in_order(state)[:2])


# -- people's commands -------------------------------------------------------------------
def test_pause_stops_new_hosts_and_resume_goes_on() -> None:
    state, fleet = begin(30, maxUnavailable=2)
    state = run(state, fleet, steps=4)
    started = len(fleet.advanced())
    state, actions = machine.step(state, Observed(hosts=fleet.observe(state), commands=("pause",)), 5.0)
    fleet.execute(actions)
    assert state.phase == "Paused"
    state = run(state, fleet, steps=20)
    assert state.phase == "Paused" and len(fleet.advanced()) == started
    state = run(state, fleet, commands=lambda i, s: ("resume",) if i == 0 else ())
    assert state.phase == "Complete" and len(fleet.advanced()) == 30


def test_undo_reverts_every_changed_host_and_a_rolled_back_rollout_does_not_resume() -> None:
    state, fleet = begin(30, maxUnavailable=3)
    state = run(state, fleet, steps=6)
    changed = sorted(h for h, g in fleet.held.items() if g == 2)
    assert changed
    state = run(state, fleet, commands=lambda i, s: ("undo",) if i == 0 else ())
    assert (state.phase, state.reason, state.rolledBack) == ("Halted", "Undone", True)
    assert sorted(a.host for a in fleet.log if isinstance(a, Revert)) == sorted(
        h for h in hosts(30) if h in fleet.advanced())
    assert set(fleet.held.values()) == {1}
    for command in ("resume", "undo", "pause"):
        again, actions = machine.step(state, Observed(commands=(command,)), 99.0)
        assert again == state and [a.reason for a in actions if isinstance(a, Event)] == ["Ignored"]


def test_undo_after_complete_puts_the_fleet_back_on_the_previous_generation() -> None:
    state, fleet = begin(8)
    state = run(state, fleet)
    assert state.phase == "Complete"
    state = run(state, fleet, commands=lambda i, s: ("undo",) if i == 0 else ())
    assert (state.phase, state.rolledBack) == ("Halted", True) and set(fleet.held.values()) == {1}


# -- membership and generations ----------------------------------------------------------
def test_a_host_enrolling_mid_rollout_holds_the_last_completed_generation_then_joins_the_last_wave() -> None:
    state, fleet = begin(20, soak="1m")
    state = run(state, fleet, steps=3)
    assert state.wave == 0
    fleet.held["late"] = 0
    state, actions = machine.step(state, Observed(hosts=fleet.observe(state), enrolled=("late",)), 3.0)
    fleet.execute(actions)
    assert Hold("late", 1) in actions and Advance("late", 2) not in actions
    assert state.hosts["late"].wave == 2 and fleet.held["late"] == 1
    state = run(state, fleet, now=4.0, tick=30.0)
    assert state.phase == "Complete" and fleet.held["late"] == 2
    assert fleet.advanced().index("late") > fleet.advanced().index(in_order(state)[1])


def test_a_host_enrolling_after_completion_gets_the_completed_generation_at_once() -> None:
    state, fleet = begin(5)
    state = run(state, fleet)
    state, actions = machine.step(state, Observed(enrolled=("late",)), 100.0)
    assert [a for a in actions if not isinstance(a, Event)] == [Hold("late", 2)]
    assert state.phase == "Complete" and state.hosts["late"].stage == "updated"


def test_a_host_leaving_mid_wave_does_not_hold_the_wave() -> None:
    state, fleet = begin(10, waves=[{"hosts": 3}, {"percent": 100}], maxUnavailable=3)
    gone = in_order(state)[0]
    fleet.fails = {}
    state, _ = machine.step(state, Observed(departed=(gone,)), 1.0)
    assert gone not in state.hosts
    state = run(state, fleet)
    assert state.phase == "Complete" and len(state.hosts) == 9


def test_deletion_rolls_out_in_waves_like_any_change_and_rolls_back_to_the_settings() -> None:
    """Generation 3 deletes the profile: every host that held its settings must restore them."""
    before = {h: {"sda/read_ahead_kb": 4096} for h in hosts(50)}
    before["bare"] = {}
    concerned = machine.concerned(before, {})
    assert concerned == sorted(hosts(50))
    assert machine.concerned(before, before) == []
    fleet = Fleet.of(concerned, generation=2)
    state, actions = machine.start("web", spec(), 3, 2, concerned, now=0.0)
    fleet.execute(actions)
    assert [a for a in actions if isinstance(a, Advance)] == [Advance(in_order(state)[0], 3)]
    canary = in_order(state)[0]
    fleet.fails = {in_order(state)[1]: "apply-failed"}
    state = run(state, fleet)
    assert (state.phase, state.reason) == ("Halted", "FailureLimit")
    assert sorted(a.host for a in fleet.log if isinstance(a, Revert)) == sorted(
        [canary, in_order(state)[1]] + [h for h in in_order(state)[2:6] if h in fleet.advanced()])
    assert set(fleet.held.values()) == {2}


def test_a_new_generation_mid_rollout_starts_over_from_the_last_completed_one() -> None:
    state, fleet = begin(40, maxUnavailable=2)
    state = run(state, fleet, steps=5)
    at_two = sorted(h for h, g in fleet.held.items() if g == 2)
    assert at_two and state.phase == "Progressing"
    new, actions = machine.supersede(state, spec(), 3, [], now=10.0)
    fleet.execute(actions)
    assert new.previous == 1 and new.generation == 3 and sorted(new.hosts) == at_two
    canary = in_order(new)[0]
    assert [a for a in actions if isinstance(a, Advance)] == [Advance(canary, 3)]
    assert {h: s.generation for h, s in new.hosts.items() if h != canary} == dict.fromkeys(
        [h for h in at_two if h != canary], 2), "the others keep generation 2 until their wave"
    fleet.fails = {canary: "apply-failed"}
    new = run(new, fleet)
    assert (new.phase, new.reason, new.rolledBack) == ("Halted", "FailureLimit", True)
    assert sorted(a.host for a in actions + fleet.log if isinstance(a, Revert)) == at_two
    assert set(fleet.held.values()) == {1}, "every host back on the last completed generation"


def test_a_new_generation_after_completion_starts_from_it() -> None:
    state, fleet = begin(6)
    state = run(state, fleet)
    new, actions = machine.supersede(state, spec(), 3, hosts(6), now=50.0)
    canary = in_order(new)[0]
    assert [a for a in actions if isinstance(a, Advance)] == [Advance(canary, 3)]
    assert new.previous == 2 and all(s.generation == 2 for h, s in new.hosts.items() if h != canary)


def test_all_at_once_changes_every_host_in_the_first_step() -> None:
    state, fleet = begin(1000, strategy="all-at-once")
    assert len(fleet.advanced()) == 1000
    fleet.fails = {hosts(1000)[0]: "apply-failed"}
    state = run(state, fleet)
    assert state.phase == "Complete" and state.failures == 1


def test_no_host_concerned_is_complete_at_once() -> None:
    state, _ = machine.start("web", spec(), 2, 1, [], now=0.0)
    assert state.phase == "Complete"


def test_the_state_survives_a_restart_through_json() -> None:
    state, fleet = begin(30, analysis=STREAM, soak="30s", maxUnavailable="20%")
    state = run(state, fleet, steps=7, tick=5.0)
    restored = RolloutState.model_validate_json(state.model_dump_json())
    assert restored == state
    observed = Observed(hosts=fleet.observe(state))
    assert machine.step(restored, observed, 40.0) == machine.step(state, observed, 40.0)


# -- at every moment ---------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(fleet_size=st.integers(min_value=1, max_value=40),
       fields=st.fixed_dictionaries({
           "maxUnavailable": st.sampled_from([1, 2, 5, "10%", "50%", "100%"]),
           "maxFailures": st.sampled_from([0, 1, 3, "10%"]),
           "onFailure": st.sampled_from(["rollback", "pause"]),
           "waves": st.just([{"hosts": 1}, {"percent": 30}, {"percent": 100}])}),
       seed=st.integers(min_value=0, max_value=10_000), gated=st.booleans())
def test_max_unavailable_holds_and_no_host_changes_outside_an_open_wave(
        fleet_size: int, fields: dict[str, Any], seed: int, gated: bool) -> None:
    rng = random.Random(seed)
    names = hosts(fleet_size)
    if gated:
        fields = {**fields, "analysis": STREAM}
    fleet = Fleet.of(names, generation=1)
    kinds: list[machine.FailureKind] = ["apply-failed", "unreachable", "drift"]
    fleet.fails = {h: rng.choice(kinds) for h in names if rng.random() < 0.1}
    fleet.verdicts = {h: "failed" for h in names if rng.random() < 0.05}
    state, actions = machine.start("web", spec(**fields), 2, 1, names, now=0.0)
    fleet.execute(actions)

    def check(s: RolloutState) -> None:
        fleet.unhealthy = {h for h in names if rng.random() < 0.1}
        for wave in range(s.waves):
            members = [h for h, hs in s.hosts.items() if hs.wave == wave]
            busy = sum(1 for h in members if s.hosts[h].stage in ("baseline", "changing", "analysing"))
            assert busy <= waves.max_unavailable(s.spec, len(members))
            if wave > s.wave:
                assert all(s.hosts[h].generation == 1 for h in members), "changed outside an open wave"
        if s.rollback:
            assert all(hs.generation == 1 for hs in s.hosts.values())

    def commands(i: int, s: RolloutState) -> tuple[machine.Command, ...]:
        return (rng.choice(["pause", "resume", "resume"]),) if rng.random() < 0.05 else ()

    state = run(state, fleet, steps=2000, commands=commands, check=check)
    if state.phase == "Paused":
        state = run(state, fleet, commands=lambda i, s: ("resume",) if i == 0 else (), check=check)
    assert state.phase in ("Complete", "Halted")
    if state.phase == "Complete":
        assert state.failures - state.excused <= waves.max_failures(state.spec, fleet_size) or state.excused
    advanced = fleet.advanced()
    assert len(advanced) == len(set(advanced)), "a host was asked twice"


def test_an_observation_of_a_host_outside_the_rollout_is_ignored() -> None:
    state, _ = begin(3)
    stranger = Observed(hosts={"stranger": HostObservation(failure="drift")})
    again, actions = machine.step(state, stranger, 1.0)
    assert again.failures == 0 and "HostFailed" not in [a.reason for a in actions if isinstance(a, Event)]


def test_hostile_a_host_unreachable_before_its_wave_opens_is_no_failure_of_the_rollout() -> None:
    """Only hosts the rollout has touched can fail it: a later wave's host down for maintenance
    must not halt the canary's wave."""
    state, fleet = begin(20)
    later = in_order(state)[-1]
    down = HostObservation(generation=1, healthy=False, failure="unreachable")
    observed = {**fleet.observe(state), later: down}
    state, _ = machine.step(state, Observed(hosts=observed), 1.0)
    assert state.failures == 0 and state.phase == "Progressing" and state.hosts[later].stage == "pending"


def test_by_default_a_thousand_hosts_go_one_then_ten_then_ninety_at_a_time() -> None:
    state, fleet = begin(1000)
    per_step: list[int] = []

    def count(s: RolloutState) -> None:
        per_step.append(sum(1 for a in fleet.log if isinstance(a, Advance)) - sum(per_step))

    state = run(state, fleet, check=count)
    assert state.phase == "Complete" and len(fleet.advanced()) == 1000
    assert max(per_step) == 90 and len(per_step) <= 25
