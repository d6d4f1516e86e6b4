"""What a rollout costs (issue 27, performance): the driver's shortcuts must decide exactly what
the long way decides.

- A step reads only the observations the machine reads (``observe(moving_only=True)``): the
  machine must step the same on them as on every host's.
- A step is decided once, on a read, and written only if the row is still at the version it was
  decided on: a command queued in between must survive for the next step, not be cleared unseen.
- The parsed state is kept by the row's version: a row another writer changed is read again.
- A profile write that starts a rollout does not ask the reconciler to look at hosts pinned at
  the very generation they held (a thousand no-op looks queued ahead of the canary).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.rollout import machine
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.server import controller, rollout_driver
from stortune.server.db.tables import Rollout
from stortune.server.models.agents import Registration
from stortune.server.rollout_driver import RolloutDriver, observe
from stortune.server.services import hosts, profiles, rollouts
from stortune.server.services.fleet_state import FleetState, HostRecord
from stortune.server.services.host_keys import Proof
from tests.server.builders import host_key, loop_topology, profile_doc, registration, with_changes
from tests.server.support import FakeClock

NAME = "streaming"
FLEET = [f"h{i}" for i in range(12)]
STAGES: tuple[machine.Stage, ...] = ("pending", "baseline", "changing", "analysing", "updated", "failed",
                                     "reverting", "reverted")


# -- the machine steps the same on the hosts it reads ----------------------------------------------
def record(name: str, rng: random.Random) -> HostRecord:
    conditions = {"Ready": (rng.choice(["True", "False"]), ""),
                  "Reachable": (rng.choice(["True", "False"]), ""),
                  "Applied": (rng.choice(["True", "False"]), rng.choice(["ApplyFailed", "Applied", "Busy"]))}
    applied = {NAME: rng.choice([1, 2])} if rng.random() < 0.8 else {}
    return HostRecord(name=name, version=1, address="", agent_version="", kernel="", conditions=conditions,
                      labels={"role": "streamer"}, settings=(), applied=applied,
                      rejected_at=(frozenset({(NAME, rng.choice([1, 2]))}) if rng.random() < 0.05
                                   else frozenset()))


def random_state(rng: random.Random, hosts: int) -> machine.RolloutState:
    spec = RolloutSpec.model_validate({"waves": [{"hosts": 1}, {"percent": 30}, {"percent": 100}],
                                       "maxFailures": rng.choice([0, 5, "50%"]),
                                       "onFailure": rng.choice(["rollback", "pause"])})
    state, _ = machine.start(NAME, spec, 2, 1, [f"n{i}" for i in range(hosts)], now=0.0)
    wave = rng.randrange(3)
    moved = {}
    for host, hs in state.hosts.items():
        # Earlier waves done or failed, the open one anywhere, later ones mostly pending.
        stage = (rng.choice(["updated", "updated", "failed"]) if hs.wave < wave
                 else rng.choice(STAGES) if hs.wave == wave
                 else rng.choice(["pending", "pending", "pending", "updated"]))
        # A pending host may hold another generation: a superseded rollout had changed it.
        held = rng.choice([1, 1, 3]) if stage == "pending" else 2
        moved[host] = hs.model_copy(update={"stage": stage, "generation": held})
    return state.model_copy(update={"hosts": moved, "wave": wave,
                                    "phase": rng.choice(["Progressing", "Progressing", "Paused", "Halted"])})


@pytest.mark.parametrize("seed", range(200))
def test_hostile_the_machine_steps_the_same_on_the_moving_hosts_alone(seed: int) -> None:
    rng = random.Random(seed)
    state = random_state(rng, rng.choice([1, 7, 40]))
    records = {h: record(h, rng) for h in state.hosts if rng.random() < 0.95}  # some departed
    args: dict[str, Any] = {"holds_nothing": lambda _h, g: g == 0, "selects": None, "known": set(state.hosts),
                            "commands": rng.sample(["pause", "resume", "undo"], rng.randrange(2))}
    every = observe(state, records, **args)
    moving = observe(state, records, moving_only=True, **args)
    assert set(moving.hosts) < set(every.hosts) or set(moving.hosts) == set(every.hosts)
    assert moving.departed == every.departed
    for now in (0.0, 1e6):
        assert machine.step(state, moving, now) == machine.step(state, every, now)
    # Remembered observations, after some hosts' records were replaced and some pins moved, are
    # the ones made afresh.
    memo: rollout_driver.Memo = {}
    observe(state, records, memo=memo, **args)
    changed = {h: record(h, rng) for h in records if rng.random() < 0.3}
    records = {**records, **changed}
    repinned = {h: hs.model_copy(update={"generation": 3 - hs.generation if hs.generation in (1, 2) else 1})
                for h, hs in state.hosts.items() if rng.random() < 0.2}
    state = state.model_copy(update={"hosts": {**state.hosts, **repinned}})
    assert observe(state, records, memo=memo, **args) == observe(state, records, **args)


def test_a_thousand_pending_hosts_are_not_observed_one_by_one() -> None:
    rng = random.Random(7)
    spec = RolloutSpec()
    state, _ = machine.start(NAME, spec, 2, 1, [f"n{i}" for i in range(1000)], now=0.0)
    records = {h: record(h, rng) for h in state.hosts}
    seen = observe(state, records, holds_nothing=lambda _h, g: g == 0, selects=None, known=set(state.hosts),
                   moving_only=True)
    # The canary is changing; every other host waits for its wave and is left out.
    changing = [h for h, hs in state.hosts.items() if hs.stage == "changing"]
    assert list(seen.hosts) == changing and len(changing) == 1


# -- a driver on a database, stepped by hand ---------------------------------------------------------
@pytest.fixture
def requests(sessions: sessionmaker[Session]) -> controller.RecordingController:
    recorder = controller.RecordingController()
    controller.bind(sessions, recorder)
    return recorder


def doc(read_ahead_kb: int, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    body = profile_doc(NAME, settings={"read_ahead_kb": read_ahead_kb})
    return with_changes(body, rollout=rollout) if rollout is not None else body


def write(sessions: sessionmaker[Session], clock: FakeClock, body: dict[str, Any], *,
          create: bool = False) -> None:
    with sessions() as session:
        if create:
            profiles.create(session, profiles.validate(body), clock())
        else:
            profiles.replace(session, NAME, profiles.validate(body), clock())


@pytest.fixture
def held(sessions: sessionmaker[Session], clock: FakeClock) -> list[str]:
    """FLEET registered, holding generation 1 (read_ahead_kb 4096), applied and Ready."""
    for name in FLEET:
        body = registration(name, topology=loop_topology(name), topology_hash=f"topology-of-{name}")
        with sessions() as session:
            hosts.register(session, Registration.model_validate(body), proof=Proof(host_key(name)),
                           lease_duration_s=3600, now=clock())
    write(sessions, clock, doc(4096, {"strategy": "all-at-once"}), create=True)
    report(sessions, clock, 1, *FLEET)
    return FLEET


def report(sessions: sessionmaker[Session], clock: FakeClock, generation: int, *names: str) -> None:
    for name in names:
        with sessions() as session:
            hosts.write_status(session, name, applied_generations={NAME: generation}, now=clock(),
                               conditions=[("Applied", "True", "Applied", ""),
                                           ("Reachable", "True", "Seen", ""),
                                           ("Drifted", "False", "InSync", "")])


def row(sessions: sessionmaker[Session]) -> tuple[machine.RolloutState, list[Any], int]:
    with sessions() as session:
        found = session.get(Rollout, NAME)
        assert found is not None
        return machine.RolloutState.model_validate(found.state), list(found.commands), found.version


def driver(sessions: sessionmaker[Session], clock: FakeClock) -> RolloutDriver:
    return RolloutDriver(sessions, FleetState(sessions), clock=clock)


def test_hostile_hosts_pinned_at_what_they_held_are_not_reconciled_for_the_write(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
    requests: controller.RecordingController,
) -> None:
    requests.clear()
    write(sessions, clock, doc(8192))
    state, _, _ = row(sessions)
    (canary,) = [h for h, hs in state.hosts.items() if hs.stage == "changing"]
    assert requests.hosts() == {canary}
    # A new generation mid-rollout: the canary moves on to it, every other host still holds 1.
    report(sessions, clock, 2, canary)
    requests.clear()
    write(sessions, clock, doc(2048))
    with sessions() as session:
        pinned = rollouts.pins_of(session, NAME)
    assert pinned == {h: 3 if h == canary else 1 for h in held}
    assert requests.hosts() == {canary}
    # All at once: every selected host takes it, so every one is asked for.
    requests.clear()
    write(sessions, clock, doc(1024, {"strategy": "all-at-once"}))
    assert requests.hosts() == set(held)


def test_hostile_a_command_queued_between_the_decision_and_the_write_is_kept(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(sessions, clock, doc(8192))
    steps = driver(sessions, clock)
    with sessions() as session:
        rollouts.command(session, NAME, "pause", "alice", clock())
    decide = rollout_driver._decide
    calls = []

    def late_undo(*args: Any, **kwargs: Any) -> Any:
        decided = decide(*args, **kwargs)
        if not calls:  # once: the undo lands after the step that saw only the pause was decided
            calls.append(1)
            with sessions() as session:
                rollouts.command(session, NAME, "undo", "bob", clock())
        return decided

    monkeypatch.setattr(rollout_driver, "_decide", late_undo)
    before, _, _ = row(sessions)
    assert steps.pass_once() == []  # the row moved on: nothing written
    state, commands, _ = row(sessions)
    assert state == before and [c["command"] for c in commands] == ["pause", "undo"]
    # The next pass decides on both.
    assert steps.pass_once() == [NAME]
    state, commands, _ = row(sessions)
    assert (state.phase, state.reason, state.rollback, commands) == ("Halted", "Undone", True, [])


def test_hostile_a_row_another_writer_changed_is_read_again(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    write(sessions, clock, doc(8192))
    steps = driver(sessions, clock)
    state, _, _ = row(sessions)
    (canary,) = [h for h, hs in state.hosts.items() if hs.stage == "changing"]
    steps.pass_once()  # parsed and kept at this version
    # Another server's step: the canary updated, wave 2 open with its first hosts changing.
    report(sessions, clock, 2, canary)
    other = driver(sessions, clock)
    assert other.pass_once() == [NAME]
    theirs, _, version = row(sessions)
    assert theirs.wave == 1 and theirs.hosts[canary].stage == "updated"
    # This driver must step from the stored state, not the one it kept: nothing new to do yet.
    assert steps.pass_once() == []
    assert row(sessions) == (theirs, [], version)
    changing = sorted(h for h, hs in theirs.hosts.items() if hs.stage == "changing")
    report(sessions, clock, 2, *changing)
    assert steps.pass_once() == [NAME]
    mine, _, _ = row(sessions)
    assert all(mine.hosts[h].stage == "updated" for h in changing)


def test_hostile_a_rollout_started_again_at_the_same_version_is_read_again(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    write(sessions, clock, doc(8192))
    steps = driver(sessions, clock)
    assert steps.pass_once() == []  # the canary has not reported: kept as read, nothing written
    _, _, first = row(sessions)
    # All at once ends it (the row goes), and a new generation starts a rollout anew: its row
    # counts its version from the start again, at the very version this driver kept.
    write(sessions, clock, doc(2048, {"strategy": "all-at-once"}))
    report(sessions, clock, 3, *held)
    write(sessions, clock, doc(1024))
    fresh, _, version = row(sessions)
    assert version == first and fresh.generation == 4
    (canary,) = [h for h, hs in fresh.hosts.items() if hs.stage == "changing"]
    report(sessions, clock, 4, canary)
    assert steps.pass_once() == [NAME]
    stepped, _, _ = row(sessions)
    assert stepped.generation == 4 and stepped.hosts[canary].stage == "updated" and stepped.wave == 1


def test_the_step_written_is_the_state_kept(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # Step after step on the kept state, the stored row and the kept state never differ.
    write(sessions, clock, doc(8192))
    steps = driver(sessions, clock)
    for _ in range(20):
        steps.pass_once()
        state, _, _ = row(sessions)
        with sessions() as session:
            found = session.get(Rollout, NAME)
            assert found is not None
            kept = steps._parsed.get(NAME, (found.version, found.generation, found.updated_at))
        assert kept is not None and kept[0] == state and list(kept[0].hosts) == list(
            rollout_driver.in_rollout_order(state).hosts)
        if state.phase == "Complete":
            break
        report(sessions, clock, 2, *(h for h, hs in state.hosts.items() if hs.stage == "changing"))
    assert state.phase == "Complete"
