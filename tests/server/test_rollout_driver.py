"""The rollout driver: the pure machine stepped over simulated hosts (issue 27).

The observation builder is pure and tested on records alone. The rest runs the app with its
real reconciler and driver against fake agents (FakeAgentClients), on SQLite and PostgreSQL:
a profile's change goes out wave by wave, bounded by maxUnavailable at every driver step, a
failing canary halts it, people pause, resume and undo it, a host enrolling meanwhile gets
the last completed generation, a deletion rolls out too, a killed server's successor goes on
from the stored state, and of two replicas exactly one steps a profile's rollout. Waits poll
for a state with a generous deadline; nothing is timed.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import event, select
from sqlalchemy.exc import DisconnectionError, OperationalError

from stortune.schemas.rollout import machine
from stortune.schemas.rollout import waves as dealing
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.schemas.topology import Topology
from stortune.server import Settings
from stortune.server.agentclient import AgentBusy, AgentError, FakeAgentClient, FakeAgentClients, HostInfo
from stortune.server.cli import main
from stortune.server.db.tables import Event, Host, Profile, Rollout, RolloutPin
from stortune.server.errors import Conflict
from stortune.server.rollout_driver import Analysis, can_move, in_rollout_order, observe, pending_commands
from stortune.server.services import rollouts
from stortune.server.services.fleet_state import HostRecord
from stortune.server.shards import SHARDS
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, TestClient, admin_client, issue_token
from tests.server.test_server_process import free_port, wait_until_serving

PROFILE = "streaming"
HOSTS = [f"h{i:02d}" for i in range(20)]
FAST = {"reconcile_interval_s": 0.5, "rollout_interval_s": 0.05}
DEADLINE = 60.0
#: Short, so a killed server's shards pass on soon; long enough that a busy machine renews in time.
SHARD_LEASE_S = 5
#: 1 / 15% / 100% of 20 hosts: waves of 1, 2 and 17 (sizes count the waves before, spec.py).
WAVES: dict[str, Any] = {"waves": [{"hosts": 1}, {"percent": 15}, {"percent": 100}]}


# -- the interval ------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", ["0", "-1", "60.5", "nan"])
def test_hostile_a_rollout_interval_out_of_bounds_is_refused_at_start_naming_it(
        seconds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rollout-interval", seconds, "--insecure", "--state-dir", str(tmp_path)]) == 1
    assert "rollout_interval_s" in capsys.readouterr().err


def test_the_rollout_interval_at_its_bounds() -> None:
    assert Settings().rollout_interval_s == 1.0
    assert Settings(rollout_interval_s=60).rollout_interval_s == 60
    assert Settings(rollout_interval_s=0.001).rollout_interval_s == 0.001
    with pytest.raises(ValidationError, match="rollout_interval_s"):
        Settings(rollout_interval_s=60.001)


# -- the observation, pure ---------------------------------------------------------------------
def record(name: str, *, applied: dict[str, int] | None = None, ready: str = "True",
           reachable: str = "True", applied_condition: tuple[str, str] = ("True", "Applied"),
           rejected: frozenset[str] = frozenset(), labels: dict[str, str] | None = None,
           rejected_at: frozenset[tuple[str, int | None]] = frozenset()) -> HostRecord:
    return HostRecord(name=name, version=1, address=f"{name}:7443", agent_version="fake", kernel="6.1",
                      conditions={"Ready": (ready, ""), "Reachable": (reachable, ""),
                                  "Applied": applied_condition},
                      labels=labels or {"role": "streamer"}, settings=(), applied=applied or {},
                      rejected=rejected or frozenset(p for p, _ in rejected_at), rejected_at=rejected_at)


def state_of(hosts: dict[str, machine.HostState], generation: int = 2, previous: int = 1,
             **spec: Any) -> machine.RolloutState:
    return machine.RolloutState(profile=PROFILE, spec=RolloutSpec.model_validate(spec), generation=generation,
                                previous=previous, waves=3, hosts=hosts, started=0.0)


def nothing_at(*generations: int) -> Callable[[str, int], bool]:
    return lambda _host, generation: generation in generations


def streamer(r: HostRecord) -> bool:
    return r.labels.get("role") == "streamer"


def test_hostile_a_host_failing_another_profile_after_it_took_this_one_is_not_failed() -> None:
    # Applied is host-wide: ApplyFailed while the host already holds its pinned generation
    # is some other profile's trouble, not this rollout's.
    st = state_of({"a": machine.HostState(wave=0, generation=2, stage="updated")})
    seen = observe(st, {"a": record("a", applied={PROFILE: 2}, applied_condition=("False", "ApplyFailed"))},
                   holds_nothing=nothing_at(0), selects=streamer, known={"a"})
    assert seen.hosts["a"].failure is None and seen.hosts["a"].generation == 2


def test_hostile_applied_false_for_a_reason_that_is_no_verdict_is_no_failure() -> None:
    st = state_of({"a": machine.HostState(wave=0, generation=2, stage="changing")})
    waiting = record("a", applied={PROFILE: 1}, applied_condition=("False", "ExperimentRunning"))
    seen = observe(st, {"a": waiting}, holds_nothing=nothing_at(0), selects=streamer, known={"a"})
    assert seen.hosts["a"].failure is None and seen.hosts["a"].generation == 1


def test_hostile_junk_commands_in_the_row_are_dropped() -> None:
    stored: Any = [{"command": "pause", "by": "x"}, {"command": "rm -rf"}, "undo", {"by": "y"},
                   {"command": 7}, {"command": "resume"}]
    st = state_of({})
    seen = observe(st, {}, holds_nothing=nothing_at(0), selects=None, known=(),
                   commands=pending_commands(stored))
    assert seen.commands == ("pause", "resume")
    assert pending_commands({"command": "pause"}) == [] and pending_commands(None) == []


def test_hostile_a_departed_host_and_a_host_without_a_record_of_this_profile() -> None:
    st = state_of({"gone": machine.HostState(wave=0, generation=2, stage="changing"),
                   "fresh": machine.HostState(wave=1, generation=1)})
    seen = observe(st, {"fresh": record("fresh")}, holds_nothing=nothing_at(0), selects=streamer,
                   known={"gone", "fresh"})
    assert seen.departed == ("gone",)
    # Pinned at 1, which holds something: absent from applied is "not reported yet", not "reached".
    assert seen.hosts["fresh"].generation is None


def test_failures_in_order_unreachable_then_blocked_then_apply_failed() -> None:
    st = state_of({h: machine.HostState(wave=0, generation=2, stage="changing") for h in "abcd"})
    records = {
        "a": record("a", reachable="False", rejected_at=frozenset({(PROFILE, 2)}),
                    applied_condition=("False", "ApplyFailed")),
        "b": record("b", rejected_at=frozenset({(PROFILE, 2)}), applied_condition=("False", "Rejected")),
        "c": record("c", applied={PROFILE: 1}, applied_condition=("False", "ApplyFailed")),
        "d": record("d", rejected_at=frozenset({("another", 4)}), ready="False"),
    }
    seen = observe(st, records, holds_nothing=nothing_at(0), selects=streamer, known=set("abcd"))
    assert {h: o.failure for h, o in seen.hosts.items()} == {
        "a": "unreachable", "b": "blocked", "c": "apply-failed", "d": None}
    assert [o.healthy for o in seen.hosts.values()] == [True, True, True, False]


def test_hostile_a_rejection_an_earlier_generation_left_does_not_fail_the_one_that_fixes_it() -> None:
    """Hostile: generation 1 set a value the device refused; generation 2 mends it. The host's
    settings table (and its Applied=False/Rejected) still show generation 1's rejection until the
    reconciler applies 2, and the driver failed the host as blocked the moment its wave began: the
    fix could never roll out. Only a rejection at the generation the host is pinned at counts."""
    st = state_of({h: machine.HostState(wave=0, generation=2, stage="changing")
                   for h in ("old", "new", "other")})
    rejected = ("False", "Rejected")
    records = {
        "old": record("old", applied={PROFILE: 1}, rejected_at=frozenset({(PROFILE, 1)}),
                      applied_condition=rejected),
        "new": record("new", applied={PROFILE: 2}, rejected_at=frozenset({(PROFILE, 2)}),
                      applied_condition=rejected),
        "other": record("other", applied={PROFILE: 1}, rejected_at=frozenset({("another", 3)}),
                        applied_condition=rejected),
    }
    seen = observe(st, records, holds_nothing=nothing_at(0), selects=streamer, known=set(records))
    assert {h: o.failure for h, o in seen.hosts.items()} == {"old": None, "new": "blocked", "other": None}
    # A refusal the table does not explain (the agent refused the whole apply) still counts.
    alone = {"old": record("old", applied={PROFILE: 1}, applied_condition=rejected)}
    seen = observe(state_of({"old": st.hosts["old"]}), alone, holds_nothing=nothing_at(0), selects=streamer,
                   known={"old"})
    assert seen.hosts["old"].failure == "apply-failed"


def test_a_generation_that_holds_nothing_is_reached_when_the_profile_is_gone_from_applied() -> None:
    # A deletion (tombstone 3) and a revert to 0: the host reports neither, it reports the absence.
    st = state_of({"del": machine.HostState(wave=0, generation=3, stage="changing"),
                   "zero": machine.HostState(wave=0, generation=0, stage="reverting"),
                   "still": machine.HostState(wave=0, generation=3, stage="changing")},
                  generation=3, previous=0)
    records = {"del": record("del"), "zero": record("zero"), "still": record("still", applied={PROFILE: 2})}
    seen = observe(st, records, holds_nothing=nothing_at(0, 3), selects=None, known=set(st.hosts))
    assert seen.hosts["del"].generation == 3
    assert seen.hosts["zero"].generation == 0
    assert seen.hosts["still"].generation == 2  # still holds the old generation: not there yet


def test_enrolled_are_selected_hosts_neither_known_nor_in_the_rollout() -> None:
    st = state_of({"a": machine.HostState(wave=0, generation=1)})
    records = {"a": record("a"), "known": record("known"), "new": record("new"),
               "other": record("other", labels={"role": "db"})}
    seen = observe(st, records, holds_nothing=nothing_at(0), selects=streamer, known={"a", "known"})
    assert seen.enrolled == ("new",)
    # A profile being deleted enrols nobody.
    assert observe(st, records, holds_nothing=nothing_at(0), selects=None, known=set()).enrolled == ()


def test_analysis_observations_reach_the_machine() -> None:
    st = state_of({"a": machine.HostState(wave=0, generation=1, stage="baseline")})
    seen = observe(st, {"a": record("a")}, holds_nothing=nothing_at(0), selects=streamer, known={"a"},
                   analysis={"a": Analysis(baseline=True, verdict="failed")})
    assert seen.hosts["a"].baseline and seen.hosts["a"].verdict == "failed"


def test_hostile_hosts_stored_out_of_order_are_started_in_rollout_order() -> None:
    # PostgreSQL's JSONB gives an object's keys back sorted by length, then bytes: not the order
    # the machine dealt them in, which is the order it starts a wave's hosts in.
    hosts = [f"host-{i}" for i in range(30)]
    spec = RolloutSpec.model_validate(WAVES)
    st, _ = machine.start(PROFILE, spec, 2, 1, hosts, now=0.0)
    jsonb = dict(sorted(st.hosts.items(), key=lambda kv: (len(kv[0]), kv[0])))
    shuffled = st.model_copy(update={"hosts": jsonb})
    assert list(shuffled.hosts) != list(st.hosts)
    in_order = [h for w in dealt(hosts, spec) for h in w]
    assert list(in_rollout_order(shuffled).hosts) == list(st.hosts) == in_order
    # So the next host started is the same whichever way the state was stored.
    done = {h: hs.model_copy(update={"stage": "updated", "generation": 2}) for h, hs in st.hosts.items()
            if hs.wave == 0}
    ready = {h: machine.HostObservation(generation=2) for h in done}
    for stored in (st, shuffled):
        wave_one_done = stored.model_copy(update={"hosts": {**stored.hosts, **done}})
        _, actions = machine.step(in_rollout_order(wave_one_done), machine.Observed(hosts=ready), 1.0)
        assert [a.host for a in actions if isinstance(a, machine.Advance)] == [dealt(hosts, spec)[1][0]]


def test_which_rollouts_still_move() -> None:
    assert can_move("Complete", {}, [{"command": "undo"}])  # undo at any time, even after Complete
    assert not can_move("Complete", {}, [])
    assert not can_move("Halted", {"rolledBack": True}, [])
    assert can_move("Halted", {"rolledBack": True}, [{"command": "resume"}])  # said Ignored, consumed
    assert can_move("Halted", {"rolledBack": False}, [])  # still reverting, or waiting for resume
    assert can_move("Progressing", {}, []) and can_move("Paused", {}, [])


def test_a_thousand_hosts_observed_in_one_pass_over_the_records() -> None:
    hosts = {f"n{i}": machine.HostState(wave=2, generation=1) for i in range(1000)}
    records = {h: record(h, applied={PROFILE: 1}) for h in hosts}
    records.update({f"e{i}": record(f"e{i}") for i in range(5)})
    seen = observe(state_of(hosts), records, holds_nothing=nothing_at(0), selects=streamer, known=set(hosts))
    assert len(seen.hosts) == 1000 and len(seen.enrolled) == 5 and not seen.departed


# -- a simulated fleet -------------------------------------------------------------------------
def fake(name: str) -> FakeAgentClient:
    info = HostInfo(hostname=name, kernel="6.1.0", boot_id="boot-1", agent_version="fake")
    return FakeAgentClient(address=f"{name}.example:7443", topology=loop_topology(name), info=info)


@pytest.fixture
def agents() -> FakeAgentClients:
    fakes = FakeAgentClients()
    for name in HOSTS:
        fakes.add(fake(name))
    return fakes


def agent_of(agents: FakeAgentClients, name: str) -> FakeAgentClient:
    found: FakeAgentClient = agents.for_address(f"{name}.example:7443", name)
    return found


def read_ahead(agent: FakeAgentClient) -> Any:
    loop = agent.topology.device("loop0")
    assert loop is not None
    return loop.tunables["read_ahead_kb"].value


def register(client: TestClient, *names: str) -> None:
    for name in names:
        body = registration(name, topology=loop_topology(name))
        assert client.post(f"{API}/agents/register", json=body).status_code in (200, 201)


def doc(read_ahead_kb: int = 4096, **rollout: Any) -> dict[str, Any]:
    body = profile_doc(settings={"read_ahead_kb": read_ahead_kb})
    body["spec"]["rollout"] = rollout
    return body


@dataclass
class Sample:
    """The database as one driver step left it."""

    phase: str
    wave: int
    stages: dict[str, str]
    pinned: dict[str, int]
    applied: dict[str, int | None]
    bound: int
    profile: bool = True  # the profile's row is there


@dataclass
class Steps:
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def last(self) -> Sample | None:
        with self.lock:
            return self.samples[-1] if self.samples else None


def sample(app: FastAPI, profile: str = PROFILE) -> Sample | None:
    with app.state.sessions() as session:
        row = session.get(Rollout, profile)
        if row is None:
            return None
        state = machine.RolloutState.model_validate(row.state)
        pinned = dict(session.execute(select(RolloutPin.host, RolloutPin.generation)
                                      .where(RolloutPin.profile == profile)).all())
        applied = {name: (gens or {}).get(profile)
                   for name, gens in session.execute(select(Host.name, Host.applied_generations))}
        there = session.get(Profile, profile) is not None
    members = sum(1 for hs in state.hosts.values() if hs.wave == state.wave)
    return Sample(phase=state.phase, wave=state.wave, stages={h: hs.stage for h, hs in state.hosts.items()},
                  pinned=pinned, applied=applied, bound=dealing.max_unavailable(state.spec, members),
                  profile=there)


def watch_steps(app: FastAPI) -> Steps:
    """Record the database after each step the app's driver writes (the test's view of every moment
    the machine decided something)."""
    steps = Steps()
    driver = app.state.rollouts
    step = driver._step

    def recorded(name: str) -> bool:
        wrote: bool = step(name)
        if wrote:
            found = sample(app, name)
            if found is not None:
                with steps.lock:
                    steps.samples.append(found)
        return wrote

    driver._step = recorded
    return steps


def unreported(s: Sample, generation: int) -> set[str]:
    """Hosts pinned at ``generation`` that have not reported it: the ones being changed."""
    return {h for h, g in s.pinned.items() if g == generation and s.applied.get(h) != generation}


def current(app: FastAPI, profile: str = PROFILE) -> machine.RolloutState | None:
    with app.state.sessions() as session:
        row = session.get(Rollout, profile)
        return None if row is None else machine.RolloutState.model_validate(row.state)


def phase_is(app: FastAPI, *phases: str, profile: str = PROFILE) -> machine.RolloutState | None:
    st = current(app, profile)
    return st if st is not None and st.phase in phases else None


def command(app: FastAPI, what: str, profile: str = PROFILE) -> dict[str, Any]:
    with app.state.sessions() as session:
        return rollouts.command(session, profile, what, "test", app.state.clock())


def dealt(hosts: list[str], spec: RolloutSpec, profile: str = PROFILE) -> list[list[str]]:
    return dealing.deal(profile, hosts, dealing.waves_of(spec))


@pytest.fixture
def fleet(make_app: AppFactory, agents: FakeAgentClients) -> Iterator[tuple[FastAPI, TestClient]]:
    app = make_app(agents=agents, **FAST)
    with admin_client(app) as client:
        register(client, *HOSTS)
        yield app, client


def all_applied(app: FastAPI, generation: int | None, hosts: list[str] = HOSTS) -> bool:
    s = sample(app)
    if s is not None:
        return all(s.applied.get(h) == generation for h in hosts)
    with app.state.sessions() as session:
        applied = {n: (g or {}).get(PROFILE) for n, g in session.execute(select(Host.name,
                                                                                Host.applied_generations))}
    return all(applied.get(h) == generation for h in hosts)


# -- waves -------------------------------------------------------------------------------------
def test_waves_in_order_and_size_with_max_unavailable_at_every_step(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually) -> None:
    app, client = fleet
    steps = watch_steps(app)
    assert client.post(f"{API}/profiles", json=doc(**WAVES)).status_code == 201
    done = eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="the rollout complete")
    expected = dealt(HOSTS, RolloutSpec.model_validate(WAVES))
    assert [len(w) for w in expected] == [1, 2, 17]
    assert {h: hs.wave for h, hs in done.hosts.items()} == {h: i for i, w in enumerate(expected) for h in w}
    assert all(read_ahead(agent_of(agents, h)) == 4096 for h in HOSTS)
    assert steps.samples, "the driver wrote no step"
    for s in steps.samples:
        # Never more hosts changing than the open wave's bound (1, 1, then 2 of 17)...
        assert len(unreported(s, 1)) <= s.bound <= 2, s
        # ...and none beyond the waves opened so far, each earlier wave fully through.
        opened = {h for w in expected[:s.wave + 1] for h in w}
        assert {h for h, g in s.pinned.items() if g == 1} <= opened, s
        assert all(s.stages[h] == "updated" for w in expected[:s.wave] for h in w), s
    assert [s.wave for s in steps.samples] == sorted(s.wave for s in steps.samples)  # never back
    # Wave by wave: a host is first pinned no earlier than every host of the wave before it.
    first = {h: min(i for i, s in enumerate(steps.samples) if s.pinned.get(h) == 1)
             for h in HOSTS if any(s.pinned.get(h) == 1 for s in steps.samples)}
    for earlier, later in itertools.pairwise(expected):
        assert max(first.get(h, -1) for h in earlier) <= min(first[h] for h in later)
    assert {1, 2} <= {s.wave for s in steps.samples}
    eventually(lambda: sample(app) is not None and not sample(app).pinned,  # type: ignore[union-attr]
               what="the pins released on completion")


def test_hostile_a_stored_rollout_the_driver_cannot_read_does_not_stop_the_others(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually,
        caplog: pytest.LogCaptureFixture) -> None:
    app, client = fleet
    with app.state.sessions() as session:
        session.add(Rollout(profile="aaa-broken", generation=2, phase="Progressing", state={"hosts": "junk"},
                            known=[], commands=[{"command": "pause"}], updated_at=app.state.clock()))
        session.commit()
    assert client.post(f"{API}/profiles", json=doc(**WAVES)).status_code == 201
    eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="the readable rollout complete")
    # Said once, not at every pass (a pass ran each time a host reported meanwhile).
    assert sum("aaa-broken" in r.getMessage() for r in caplog.records) == 1
    with app.state.sessions() as session:
        broken = session.get(Rollout, "aaa-broken")
        assert broken is not None and broken.state == {"hosts": "junk"}  # left as it was, not "fixed"


def test_all_at_once_keeps_no_rollout_and_every_host_takes_the_change(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually) -> None:
    app, client = fleet
    assert client.post(f"{API}/profiles", json=doc(strategy="all-at-once")).status_code == 201
    assert current(app) is None
    eventually(lambda: all_applied(app, 1), timeout=DEADLINE, what="generation 1 everywhere at once")
    assert all(read_ahead(agent_of(agents, h)) == 4096 for h in HOSTS)


def test_hostile_a_selected_host_the_change_leaves_alone_is_not_enrolled_later(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    # "bare" has no loop device: the profile selects it but changes nothing there, so it takes
    # the generation at once and is no host of the rollout; the driver must not mistake it for a
    # host enrolling later and pin it to the previous generation.
    bare = FakeAgentClient(address="bare.example:7443", topology=Topology(hostname="bare", kernel="6.1.0"),
                           info=HostInfo(hostname="bare", kernel="6.1.0", boot_id="b", agent_version="fake"))
    agents.add(bare)
    app = make_app(agents=agents, **FAST)
    with admin_client(app) as client:
        register(client, *HOSTS)
        assert client.post(f"{API}/agents/register",
                           json=registration("bare", topology=bare.topology)).status_code in (200, 201)
        assert client.post(f"{API}/profiles", json=doc(**WAVES)).status_code == 201
        done = eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="complete")
        assert "bare" not in done.hosts
        assert not admin_events(app, "Enrolled")


# -- failures -------------------------------------------------------------------------------------
@pytest.mark.parametrize("on_failure", ["rollback", "pause"])
def test_hostile_a_failing_canary_halts_the_rollout(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually,
        on_failure: str) -> None:
    app, client = fleet
    steps = watch_steps(app)
    spec: dict[str, Any] = {"maxFailures": 0, "onFailure": on_failure}
    (canary,) = dealt(HOSTS, RolloutSpec.model_validate(spec))[0]
    agent_of(agents, canary).fail("apply", AgentError(f"{canary}.example:7443", "disk on fire", "INTERNAL"))
    assert client.post(f"{API}/profiles", json=doc(**spec)).status_code == 201
    halted = eventually(lambda: phase_is(app, "Halted"), timeout=DEADLINE, what="the rollout halted")
    assert halted.reason == "FailureLimit" and halted.failures == 1
    assert halted.hosts[canary].failure == "apply-failed"
    if on_failure == "rollback":
        st = eventually(lambda: (s := current(app)) is not None and s.rolledBack and s, timeout=DEADLINE,
                        what="rolled back")
        assert st.hosts[canary].stage == "reverted"
        assert sample(app).pinned[canary] == 0  # type: ignore[union-attr]  # previous: nothing
    else:
        assert not halted.rollback
        assert sample(app).pinned[canary] == 1  # type: ignore[union-attr]  # left where it was
    # Nobody else was ever asked to take the new generation.
    assert all(g != 1 for s in steps.samples for h, g in s.pinned.items() if h != canary)
    assert all(read_ahead(agent_of(agents, h)) == 128 for h in HOSTS)
    others = [agent_of(agents, h) for h in HOSTS if h != canary]
    assert not [a for a in others if any(m == "apply" and args for m, args in list(a.calls)
                                         if PROFILE in str(args))]


# -- steering ----------------------------------------------------------------------------------------
def busy(agents: FakeAgentClients, host: str) -> None:
    """The host's applies wait (another process holds its agent's state directory)."""
    agent_of(agents, host).fail("apply", AgentBusy(f"{host}.example:7443", "locked", "ABORTED"))


def free(app: FastAPI, agents: FakeAgentClients, host: str) -> None:
    agent_of(agents, host).fail("apply", None)
    app.state.controller.enqueue(host, "test: the agent is free")


def test_pause_holds_new_hosts_and_resume_completes(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually) -> None:
    app, client = fleet
    steps = watch_steps(app)
    (canary,) = dealt(HOSTS, RolloutSpec())[0]
    busy(agents, canary)
    assert client.post(f"{API}/profiles", json=doc()).status_code == 201
    assert command(app, "pause")["pendingCommands"][0]["command"] == "pause"
    eventually(lambda: phase_is(app, "Paused"), timeout=DEADLINE, what="paused")
    free(app, agents, canary)
    paused = eventually(lambda: (s := phase_is(app, "Paused")) and s.hosts[canary].stage == "updated" and s,
                        timeout=DEADLINE, what="the in-flight canary updated while paused")
    assert all(hs.stage == "pending" for h, hs in paused.hosts.items() if h != canary)
    assert command(app, "pause")  # twice: the second is said to do nothing, and changes nothing
    eventually(lambda: (r := current(app)) is not None and r.phase == "Paused" and not pending(app),
               timeout=DEADLINE, what="the second pause consumed")
    assert {h for h, g in sample(app).pinned.items() if g == 1} == {canary}  # type: ignore[union-attr]
    command(app, "resume")
    eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="complete after resume")
    assert all(read_ahead(agent_of(agents, h)) == 4096 for h in HOSTS)
    assert any(s.phase == "Paused" for s in steps.samples)


def pending(app: FastAPI) -> list[Any]:
    with app.state.sessions() as session:
        row = session.get(Rollout, PROFILE)
        return [] if row is None else list(row.commands)


def test_undo_mid_rollout_reverts_every_changed_host(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually) -> None:
    app, client = fleet
    expected = dealt(HOSTS, RolloutSpec.model_validate(WAVES))
    stuck = expected[1][1]  # the second host of wave 2 never finishes: the rollout sits in wave 2
    busy(agents, stuck)
    assert client.post(f"{API}/profiles", json=doc(**WAVES)).status_code == 201
    eventually(lambda: (s := current(app)) is not None and s.wave == 1 and
               s.hosts[expected[1][0]].stage == "updated" and s.hosts[stuck].stage == "changing",
               timeout=DEADLINE, what=f"wave 2 half through: {expected[1]}")
    command(app, "undo")
    st = eventually(lambda: (s := current(app)) is not None and s.rolledBack and s, timeout=DEADLINE,
                    what="undone and rolled back")
    assert st.phase == "Halted" and st.reason == "Undone"
    free(app, agents, stuck)
    eventually(lambda: all_applied(app, None), timeout=DEADLINE, what="no host holds the profile")
    assert all(g == 0 for g in sample(app).pinned.values())  # type: ignore[union-attr]
    eventually(lambda: all(read_ahead(agent_of(agents, h)) == 128 for h in HOSTS), timeout=DEADLINE,
               what="the originals restored")
    # On a rolled-back rollout an undo could only be dropped: refused saying what to do instead.
    with pytest.raises(Conflict, match="write a new generation"):
        command(app, "undo")
    assert not pending(app) and (current(app) or st).phase == "Halted"


def test_a_host_enrolling_mid_rollout_gets_the_last_completed_generation(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    app = make_app(agents=agents, **FAST)
    with admin_client(app) as client:
        register(client, *HOSTS)
        assert client.post(f"{API}/profiles", json=doc(**WAVES)).status_code == 201
        eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="generation 1 complete")
        eventually(lambda: all_applied(app, 1), timeout=DEADLINE, what="generation 1 everywhere")
        expected = dealt(HOSTS, RolloutSpec.model_validate(WAVES))
        stuck = expected[1][1]
        busy(agents, stuck)
        assert client.put(f"{API}/profiles/{PROFILE}", json=doc(8192, **WAVES)).status_code == 200
        eventually(lambda: (s := current(app)) is not None and s.wave == 1, timeout=DEADLINE, what="wave 2")
        agents.add(fake("late"))
        register(client, "late")
        st = eventually(lambda: (s := current(app)) is not None and "late" in s.hosts and s, timeout=DEADLINE,
                        what="the new host enrolled")
        assert st.hosts["late"].wave == 2 and st.hosts["late"].stage == "pending"
        eventually(lambda: all_applied(app, 1, ["late"]), timeout=DEADLINE, what="late holds generation 1")
        assert read_ahead(agent_of(agents, "late")) == 4096
        free(app, agents, stuck)
        eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="complete")
        eventually(lambda: all_applied(app, 2, [*HOSTS, "late"]), timeout=DEADLINE,
                   what="generation 2 everywhere")
        assert read_ahead(agent_of(agents, "late")) == 8192


def test_a_deletion_rolls_out_in_waves_and_the_finalizer_releases_at_the_end(
        fleet: tuple[FastAPI, TestClient], agents: FakeAgentClients, eventually: Eventually) -> None:
    app, client = fleet
    assert client.post(f"{API}/profiles", json=doc()).status_code == 201
    eventually(lambda: phase_is(app, "Complete"), timeout=DEADLINE, what="generation 1 complete")
    eventually(lambda: all_applied(app, 1), timeout=DEADLINE, what="generation 1 everywhere")
    steps = watch_steps(app)
    assert client.delete(f"{API}/profiles/{PROFILE}").status_code in (200, 202)
    expected = dealt(HOSTS, RolloutSpec())
    eventually(lambda: profile_gone(app), timeout=DEADLINE, what="the profile released")
    assert all(read_ahead(agent_of(agents, h)) == 128 for h in HOSTS)
    assert steps.samples
    for s in steps.samples:
        if s.phase == "Complete":
            continue
        lost = {h for h in HOSTS if s.applied.get(h) is None}
        assert lost <= {h for w in expected[:s.wave + 1] for h in w}, s  # wave by wave
        assert len({h for h, g in s.pinned.items() if g == 2} - lost) <= s.bound, s
    assert {1, 2} <= {s.wave for s in steps.samples}
    assert all(s.profile for s in steps.samples if s.phase != "Complete")  # the finalizer held it


def profile_gone(app: FastAPI) -> bool:
    with app.state.sessions() as session:
        return session.get(Profile, PROFILE) is None


# -- a crash -----------------------------------------------------------------------------------------
def kill(app: FastAPI) -> None:
    """As kill -9 leaves it, seen from the database: from now on the app's engine connects to
    nothing (its transactions in flight end as they end), its leases are no longer renewed."""
    engine = app.state.engine

    @event.listens_for(engine, "do_connect")
    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise OperationalError("connect", {}, Exception("the server was killed"))

    # A connection checked out at this moment goes back to the pool afterwards, and the "killed"
    # server went on with it (steps, lease renewals): no checkout succeeds any more.
    @event.listens_for(engine, "checkout")
    def gone(*_args: Any) -> None:
        raise DisconnectionError("the server was killed")

    engine.pool.dispose()


@contextmanager
def abandoned(client: TestClient) -> Iterator[TestClient]:
    """The client's app is entered here and never shut down cleanly; only its thread is ended at last."""
    client.__enter__()
    try:
        yield client
    finally:
        with suppress(Exception):
            client.__exit__(None, None, None)


def test_hostile_a_killed_server_s_successor_goes_on_from_where_it_was(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    expected = dealt(HOSTS, RolloutSpec())
    stuck = expected[2][3]  # wave 3 sits with some hosts updated and this one changing
    busy(agents, stuck)
    first = make_app(agents=agents, shard_lease_s=SHARD_LEASE_S, **FAST)
    with abandoned(admin_client(first)) as client:
        register(client, *HOSTS)
        assert client.post(f"{API}/profiles", json=doc()).status_code == 201
        eventually(lambda: (s := current(first)) is not None and s.wave == 2
                   and s.hosts[stuck].stage == "changing"
                   and sum(hs.stage == "updated" for h, hs in s.hosts.items() if h in expected[2]) >= 2,
                   timeout=DEADLINE, what="mid wave 3")
        kill(first)
        second = make_app(agents=agents, shard_lease_s=SHARD_LEASE_S, **FAST)
        at_kill = sample(second)
        assert at_kill is not None and at_kill.phase == "Progressing" and at_kill.wave == 2
        steps = watch_steps(second)
        with admin_client(second):
            free(second, agents, stuck)
            eventually(lambda: phase_is(second, "Complete"), timeout=DEADLINE,
                       what="complete after the restart")
            eventually(lambda: all_applied(second, 1), timeout=DEADLINE, what="generation 1 everywhere")
            assert len(admin_events(second, "RolloutStarted")) == 1  # went on, not started again
    # Went on from the stored state: never back to an earlier wave, nobody updated went back, and
    # the hosts still pending at the kill were started within the bound, as before it.
    assert steps.samples
    updated = {h for h, stage in at_kill.stages.items() if stage == "updated"}
    for s in steps.samples:
        assert s.wave == 2, s
        assert all(s.stages[h] == "updated" for h in updated), s
        if s.phase != "Complete":
            assert all(s.pinned[h] == 1 for h in updated), s
            assert len(unreported(s, 1)) <= s.bound, s
    with second.state.sessions() as session:
        assert len(session.scalars(select(Rollout)).all()) == 1


def admin_events(app: FastAPI, reason: str) -> list[dict[str, Any]]:
    with app.state.sessions() as session:
        rows = session.scalars(select(Event).where(Event.reason == reason, Event.profile == PROFILE)).all()
        return [{"reason": r.reason, "message": r.message} for r in rows]


# -- two replicas ------------------------------------------------------------------------------------
def test_two_replicas_exactly_one_steps_a_rollout(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually, db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL database")
    a = make_app(agents=agents, shard_lease_s=SHARD_LEASE_S, **FAST)
    b = make_app(agents=agents, shard_lease_s=SHARD_LEASE_S, **FAST)
    with admin_client(a) as client, admin_client(b):
        eventually(lambda: len(a.state.ownership.owned()) == len(b.state.ownership.owned()) == SHARDS // 2,
                   timeout=DEADLINE, what="the shards divided between the two")
        register(client, *HOSTS)
        assert client.post(f"{API}/profiles", json=doc()).status_code == 201
        eventually(lambda: phase_is(a, "Complete"), timeout=DEADLINE, what="complete")
        eventually(lambda: all_applied(a, 1), timeout=DEADLINE, what="generation 1 everywhere")
        owner, other = (a, b) if a.state.ownership.fence(PROFILE) is not None else (b, a)
        assert other.state.ownership.fence(PROFILE) is None
        assert owner.state.rollouts.steps.get(PROFILE, 0) > 0
        assert other.state.rollouts.steps.get(PROFILE, 0) == 0


# -- a real server process, killed with SIGKILL -----------------------------------------------------
_SERVE = """
import sys

import uvicorn

from stortune.server import Settings, create_app
from stortune.server.agentclient import AgentBusy, FakeAgentClient, FakeAgentClients, HostInfo
from tests.server.builders import loop_topology

db_url, port, busy, *names = sys.argv[1:]
agents = FakeAgentClients()
for name in names:
    agent = agents.add(FakeAgentClient(
        address=f"{name}.example:7443", topology=loop_topology(name),
        info=HostInfo(hostname=name, kernel="6.1.0", boot_id="boot-1", agent_version="fake")))
    if name == busy:
        agent.fail("apply", AgentBusy(agent.address, "locked", "ABORTED"))
settings = Settings(db_url=db_url, listen=f"127.0.0.1:{port}", reconcile_interval_s=0.5,
                    rollout_interval_s=0.05, shard_lease_s=5, lease_duration_s=3600,
                    heartbeat_interval_s=10)
uvicorn.run(create_app(settings, agents=agents), host="127.0.0.1", port=int(port), log_level="warning")
"""


@contextmanager
def server_process(db_url: str, tmp_path: Path, busy: str, log_name: str) -> Iterator[tuple[str, Any]]:
    """A stortune server of fake agents (``busy``'s applies wait) in its own process; SIGKILLed at
    the end unless the test did it first."""
    script = tmp_path / "serve.py"
    script.write_text(_SERVE)
    port = free_port()
    log = tmp_path / log_name
    root = Path(__file__).resolve().parents[2]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), db_url, str(port), busy, *HOSTS],
                                stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                env={**os.environ, "PYTHONPATH": str(root)})
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(base, proc)
            yield base, proc
        except BaseException:
            print(log.read_text(errors="replace")[-20_000:])
            raise
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_hostile_a_server_process_killed_mid_wave_is_followed_by_the_next_from_the_stored_state(
        make_app: AppFactory, db_url: str, tmp_path: Path, eventually: Eventually) -> None:
    reader = make_app()  # never started: its sessions read the database the servers share
    headers = {"Authorization": f"Bearer {issue_token(reader)}"}
    expected = dealt(HOSTS, RolloutSpec())
    stuck = expected[2][3]
    with server_process(db_url, tmp_path, stuck, "first.log") as (base, proc):
        with httpx.Client(base_url=base + API, headers=headers, timeout=10) as http:
            for name in HOSTS:
                body = registration(name, topology=loop_topology(name))
                assert http.post("/agents/register", json=body).status_code in (200, 201)
            assert http.post("/profiles", json=doc()).status_code == 201
        eventually(lambda: (s := current(reader)) is not None and s.wave == 2
                   and s.hosts[stuck].stage == "changing", timeout=DEADLINE, what="mid wave 3")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    at_kill = sample(reader)
    assert at_kill is not None and at_kill.phase == "Progressing" and at_kill.wave == 2
    updated = {h for h, stage in at_kill.stages.items() if stage == "updated"}
    seen: list[Sample] = []

    def complete() -> bool:
        s = sample(reader)
        if s is not None:
            seen.append(s)
        return s is not None and s.phase == "Complete"

    with server_process(db_url, tmp_path, "", "second.log"):
        eventually(complete, timeout=DEADLINE, what="complete after the restart")
        eventually(lambda: all_applied(reader, 1), timeout=DEADLINE, what="generation 1 everywhere")
    for s in seen:
        assert s.wave == 2 and all(s.stages[h] == "updated" for h in updated), s
        if s.phase != "Complete":
            assert all(s.pinned[h] == 1 for h in updated), s
    assert len(admin_events(reader, "RolloutStarted")) == 1  # went on, not started again
