"""Rollout storage (issue 27): spec.rollout refused naming the field, a new generation starting a
rollout in the profile's transaction (pins, tombstones, supersede), the host's desired state as
the reconciler reads it, the finalizer's wait for pinned hosts, and the migration.

The services run on the test's database without an app, so no rollout driver steps the state
while a test looks at it: what is checked is exactly what a profile write stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.rollout import machine
from stortune.schemas.rollout import waves as dealing
from stortune.schemas.rollout.spec import MAX_WAVES, WEEK, RolloutSpec
from stortune.server.db.engine import make_engine, make_sessions
from stortune.server.db.migrate import alembic_config, upgrade
from stortune.server.db.tables import Event, Profile, ProfileGeneration, Rollout, RolloutPin
from stortune.server.errors import Conflict, Invalid, NotFound
from stortune.server.models.agents import Registration
from stortune.server.reconciler import store
from stortune.server.services import finalizers, hosts, profiles, rollouts
from stortune.server.services.host_keys import Proof
from tests.server.builders import API, host_key, loop_topology, profile_doc, registration, with_changes
from tests.server.conftest import new_pg_database
from tests.server.support import FakeClock, TestClient

PROFILES = f"{API}/profiles"
NAME = "streaming"
AT_ONCE = {"strategy": "all-at-once"}


# -- fixtures and helpers ------------------------------------------------------------------------
def register(sessions: sessionmaker[Session], clock: FakeClock, *names: str,
             labels: dict[str, str] | None = None, topology: bool = True) -> None:
    for name in names:
        body = registration(name, labels=labels, topology=loop_topology(name) if topology else None,
                            topology_hash=f"topology-of-{name}" if topology else "")
        with sessions() as session:
            hosts.register(session, Registration.model_validate(body), proof=Proof(host_key(name)),
                           lease_duration_s=15, now=clock())


def doc(read_ahead_kb: int = 4096, rollout: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = profile_doc(NAME, settings={"read_ahead_kb": read_ahead_kb})
    if rollout is not None:
        spec["rollout"] = rollout
    return with_changes(body, **spec) if spec else body


def create(sessions: sessionmaker[Session], clock: FakeClock, body: dict[str, Any]) -> Profile:
    with sessions() as session:
        return profiles.create(session, profiles.validate(body), clock())


def replace(sessions: sessionmaker[Session], clock: FakeClock, body: dict[str, Any]) -> int:
    with sessions() as session:
        return profiles.replace(session, NAME, profiles.validate(body), clock()).generation


def applied(sessions: sessionmaker[Session], clock: FakeClock, generations: dict[str, int],
            *names: str) -> None:
    """What the reconciler writes once the hosts' agents applied ``generations``."""
    for name in names:
        with sessions() as session:
            hosts.write_status(session, name, applied_generations=generations, now=clock())


def pins(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as session:
        return rollouts.pins_of(session, NAME)


def rollout(sessions: sessionmaker[Session]) -> machine.RolloutState | None:
    with sessions() as session:
        row = session.get(Rollout, NAME)
        return None if row is None else machine.RolloutState.model_validate(row.state)


def stored_generations(sessions: sessionmaker[Session]) -> dict[int, bool]:
    """generation -> whether it holds a spec (False: a tombstone)."""
    with sessions() as session:
        return {g: spec is not None for g, spec in session.execute(
            sa.select(ProfileGeneration.generation, ProfileGeneration.spec)
            .where(ProfileGeneration.profile == NAME))}


def view(sessions: sessionmaker[Session], host: str) -> tuple[dict[str, int], list[int]]:
    """The reconciler's view of ``host``: its generations and the read_ahead_kb each profile wants."""
    found = store.load(sessions, host)
    assert found is not None
    wanted = [p.spec.rules[0].settings.model_dump(by_alias=True)["read_ahead_kb"] for p in found.profiles]
    assert all(p.spec.rollout is None for p in found.profiles)  # the control plane's, not sent
    return found.generations(), wanted


def canary(fleet: list[str], spec: RolloutSpec | None = None) -> str:
    (first,) = dealing.deal(NAME, fleet, dealing.waves_of(spec or RolloutSpec()))[0]
    return first


def reasons(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        return list(session.scalars(sa.select(Event.reason).where(Event.profile == NAME).order_by(Event.id)))


FLEET = ["h1", "h2", "h3", "h4"]


@pytest.fixture
def fleet(sessions: sessionmaker[Session], clock: FakeClock) -> list[str]:
    register(sessions, clock, *FLEET)
    return FLEET


@pytest.fixture
def held(sessions: sessionmaker[Session], clock: FakeClock, fleet: list[str]) -> list[str]:
    """Generation 1 (read_ahead_kb 4096) created all at once and applied on every host."""
    create(sessions, clock, doc(rollout=AT_ONCE))
    applied(sessions, clock, {NAME: 1}, *fleet)
    return fleet


# -- hostile documents, through the REST API --------------------------------------------------------
def _causes(response: Any) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in response.json()["details"]["causes"]]


_HOSTILE = [
    pytest.param({"waves": [{"hosts": i} for i in range(1, MAX_WAVES + 1)] + [{"percent": 100}]},
                 "spec.rollout.waves", "at most 20", id="21-waves"),
    pytest.param({"waves": [{"hosts": 1}] * 5000}, "spec.rollout.waves", "at most 20",
                 id="thousands-of-waves"),
    pytest.param({"waves": [{"hosts": 0}, {"percent": 100}]}, "spec.rollout.waves[0].hosts", "1 to",
                 id="zero-hosts"),
    pytest.param({"waves": [{"hosts": -5}, {"percent": 100}]}, "spec.rollout.waves[0].hosts", "1 to",
                 id="negative-hosts"),
    pytest.param({"waves": [{"percent": 0}, {"percent": 100}]}, "spec.rollout.waves[0].percent", "above 0",
                 id="zero-percent"),
    pytest.param({"waves": [{"percent": -10}, {"percent": 100}]}, "spec.rollout.waves[0].percent", "above 0",
                 id="negative-percent"),
    pytest.param({"waves": [{"hosts": 1}, {"percent": 101}]}, "spec.rollout.waves[1].percent", "at most 100",
                 id="percent-101"),
    pytest.param({"soak": "87600h"}, "spec.rollout.soak", "longer than a week", id="soak-of-ten-years"),
    pytest.param({"soak": WEEK + 1}, "spec.rollout.soak", "longer than a week",
                 id="soak-a-week-and-a-second"),
    pytest.param({"maxUnavailable": 0}, "spec.rollout.maxUnavailable", "from 1", id="max-unavailable-0"),
    pytest.param({"maxFailures": "101%"}, "spec.rollout.maxFailures", "100%", id="max-failures-101%"),
    pytest.param({"analysis": {"benchmark": {"name": "w", "pattern": "randwrite"}}},
                 "spec.rollout.analysis.benchmark", "write to the raw device",
                 id="analysis-writes-raw-device"),
    pytest.param({"analysis": {"benchmark": {"preset": "stream-32k"}, "waves": [4]}},
                 "spec.rollout.analysis.waves", "does not exist", id="analysis-of-a-missing-wave"),
    pytest.param({"strategy": "all-at-once", "soak": "1h"}, "spec.rollout.soak", "all-at-once",
                 id="at-once-soak"),
    pytest.param({"waves": [{"hosts": 1}, {"percent": 50}]}, "spec.rollout.waves[1]", "last wave",
                 id="last-wave-short"),
    pytest.param({"wave": [{"hosts": 1}]}, "spec.rollout.wave", "unknown field", id="unknown-field"),
]


@pytest.mark.parametrize(("hostile", "field", "fragment"), _HOSTILE)
def test_hostile_rollout_documents_are_422_naming_the_field(
    client: TestClient, hostile: dict[str, Any], field: str, fragment: str,
) -> None:
    response = client.post(PROFILES, json=doc(rollout=hostile))
    assert response.status_code == 422, response.text
    assert any(f == field and fragment in m for f, m in _causes(response)), _causes(response)
    assert client.get(PROFILES).json()["items"] == []
    # The same on a replace: the stored profile stays as it was.
    assert client.post(PROFILES, json=doc()).status_code == 201
    response = client.put(f"{PROFILES}/{NAME}", json=doc(8192, rollout=hostile))
    assert response.status_code == 422, response.text
    assert any(f == field for f, _ in _causes(response))
    stored = client.get(f"{PROFILES}/{NAME}").json()
    assert stored["metadata"]["generation"] == 1 and "rollout" not in stored["spec"]


def test_hostile_bounds_are_accepted_at_their_limit(client: TestClient) -> None:
    at_limit = {"waves": [{"hosts": i} for i in range(1, MAX_WAVES)] + [{"percent": 100}], "soak": WEEK,
                "maxUnavailable": "100%", "maxFailures": 100_000}
    response = client.post(PROFILES, json=doc(rollout=at_limit))
    assert response.status_code == 201, response.text
    spec = client.get(f"{PROFILES}/{NAME}").json()["spec"]["rollout"]
    assert len(spec["waves"]) == MAX_WAVES and spec["soak"] == WEEK


# -- starting a rollout ----------------------------------------------------------------------------
def test_hostile_a_change_no_host_sees_starts_no_rollout(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # A new generation (the rollout default, a higher priority, a rule for devices no host has)
    # changes no host's values: every host takes it at once, nothing pinned.
    md = {"name": "arrays", "match": {"kind": ["md"]}, "settings": {"read_ahead_kb": 64}}
    body = doc(priority=5, rules=[*doc()["spec"]["rules"], md])
    assert replace(sessions, clock, body) == 2
    assert rollout(sessions) is None and pins(sessions) == {}
    assert {h: view(sessions, h) for h in held} == dict.fromkeys(held, ({NAME: 2}, [4096]))
    assert "RolloutStarted" not in reasons(sessions)


def test_a_host_without_a_topology_is_concerned_by_selection(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    register(sessions, clock, "blind", topology=False)
    body = doc(priority=5)  # changes nothing on a host whose devices are known
    replace(sessions, clock, body)
    state = rollout(sessions)
    assert state is not None and list(state.hosts) == ["blind"]
    assert pins(sessions) == {"blind": 2}  # alone, it is the canary


def test_all_at_once_starts_no_rollout_and_ends_a_live_one(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    assert rollout(sessions) is None and pins(sessions) == {}  # generation 1 was all at once
    replace(sessions, clock, doc(8192))  # in waves: a live rollout
    assert rollout(sessions) is not None and len(pins(sessions)) == len(held)
    replace(sessions, clock, doc(1024, rollout=AT_ONCE))
    assert rollout(sessions) is None and pins(sessions) == {}
    assert {h: view(sessions, h) for h in held} == dict.fromkeys(held, ({NAME: 3}, [1024]))
    assert reasons(sessions)[-1] == "Superseded"


def test_a_new_generation_pins_hosts_at_the_previous_and_the_canary_takes_it(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    register(sessions, clock, "other", labels={"role": "database"})  # not selected: no part in it
    assert replace(sessions, clock, doc(8192)) == 2
    state = rollout(sessions)
    first = canary(held)
    assert state is not None and (state.generation, state.previous, state.phase) == (2, 1, "Progressing")
    assert sorted(state.hosts) == held and state.waves == 3
    assert {h: s.stage for h, s in state.hosts.items()} == {h: "changing" if h == first else "pending"
                                                            for h in held}
    assert pins(sessions) == {h: 2 if h == first else 1 for h in held}
    # The reconciler's view: the canary holds generation 2, the others generation 1, as stored.
    for host in held:
        assert view(sessions, host) == (({NAME: 2}, [8192]) if host == first else ({NAME: 1}, [4096]))
    assert view(sessions, "other") == ({}, [])
    assert stored_generations(sessions) == {1: True, 2: True}
    assert "RolloutStarted" in reasons(sessions)
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None and row.phase == "Progressing" and row.known == held and row.commands == []


def test_a_created_profile_pins_hosts_at_nothing(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: list[str],
) -> None:
    create(sessions, clock, doc())
    first = canary(fleet)
    state = rollout(sessions)
    assert state is not None and (state.generation, state.previous) == (1, 0)
    assert pins(sessions) == {h: 1 if h == first else 0 for h in fleet}
    for host in fleet:
        assert view(sessions, host) == (({NAME: 1}, [4096]) if host == first else ({}, []))


def test_an_unpinned_host_takes_the_current_generation(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # No live rollout (all at once): a host registering now takes the current generation. During
    # a live one it is held at the last completed (test_rollout_hostile).
    replace(sessions, clock, doc(8192, rollout=AT_ONCE))
    register(sessions, clock, "late")
    assert "late" not in pins(sessions)
    assert view(sessions, "late") == ({NAME: 2}, [8192])


def test_a_superseding_generation_starts_from_the_last_completed(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    first = canary(held)
    replace(sessions, clock, doc(8192))
    applied(sessions, clock, {NAME: 2}, first)
    assert replace(sessions, clock, doc(2048)) == 3
    state = rollout(sessions)
    assert state is not None and (state.generation, state.previous) == (3, 1)
    assert sorted(state.hosts) == held
    # Same profile, same hosts: the same canary, which goes on to generation 3 at once.
    assert pins(sessions) == {h: 3 if h == first else 1 for h in held}
    assert view(sessions, first) == ({NAME: 3}, [2048])
    assert view(sessions, held[-1] if held[-1] != first else held[0]) == ({NAME: 1}, [4096])
    # Generation 2 is no longer referenced: pruned; 1 (previous) and 3 are kept.
    assert stored_generations(sessions) == {1: True, 3: True}
    assert "Superseded" in reasons(sessions)


def test_hostile_reverting_mid_rollout_moves_only_the_changed_canary(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    first = canary(held)
    replace(sessions, clock, doc(8192))
    replace(sessions, clock, doc(4096))  # back to what generation 1 held
    state = rollout(sessions)
    # Only the canary holds something other than generation 1's values: it alone rolls.
    assert state is not None and list(state.hosts) == [first] and state.previous == 1
    assert pins(sessions) == {first: 3}
    assert {h: view(sessions, h) for h in held} == dict.fromkeys(held, ({NAME: 3}, [4096]))
    with sessions() as session:  # the others took it at once: known, so the driver enrols none of them
        row = session.get(Rollout, NAME)
        assert row is not None and row.known == held


def test_a_generation_that_no_longer_selects_the_host_holds_nothing_there(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    first = canary(held)
    replace(sessions, clock, doc(hostSelector={"matchLabels": {"tier": "gold"}}))  # selects none of them
    state = rollout(sessions)
    assert state is not None and sorted(state.hosts) == held  # their restorations roll out
    assert pins(sessions) == {h: 2 if h == first else 1 for h in held}
    for host in held:
        assert view(sessions, host) == (({}, []) if host == first else ({NAME: 1}, [4096]))


def test_hostile_a_failure_while_starting_the_rollout_leaves_the_profile_as_it_was(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("the database went away mid-write")

    monkeypatch.setattr(rollouts, "execute", broken)
    with pytest.raises(RuntimeError):
        replace(sessions, clock, doc(8192))
    # One transaction: neither the new generation nor any of its rollout was stored.
    with sessions() as session:
        row = session.get(Profile, NAME)
        assert row is not None and row.generation == 1
    assert rollout(sessions) is None and pins(sessions) == {} and stored_generations(sessions) == {1: True}
    monkeypatch.undo()
    assert replace(sessions, clock, doc(8192)) == 2 and len(pins(sessions)) == len(held)


def test_the_same_generation_written_twice_changes_nothing(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    replace(sessions, clock, doc(8192))
    before = (rollout(sessions), pins(sessions), reasons(sessions))
    assert replace(sessions, clock, doc(8192)) == 2  # a no-op replace: no new generation
    assert (rollout(sessions), pins(sessions), reasons(sessions)) == before


# -- deletion --------------------------------------------------------------------------------------
def test_deletion_writes_a_tombstone_and_pins_and_its_finalizer_waits(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    first = canary(held)
    assert replace(sessions, clock, doc()) == 2  # now in waves; no host's values change
    applied(sessions, clock, {NAME: 2}, *held)
    with sessions() as session:
        _, pending = profiles.delete(session, NAME, clock())
    assert pending
    assert stored_generations(sessions) == {2: True, 3: False}  # 3: the tombstone
    state = rollout(sessions)
    assert state is not None and (state.generation, state.previous) == (3, 2)
    assert pins(sessions) == {h: 3 if h == first else 2 for h in held}
    # The canary holds nothing of it; the others keep generation 2 while it is being deleted.
    for host in held:
        assert view(sessions, host) == (({}, []) if host == first else ({NAME: 2}, [4096]))

    # Every host reports it gone (the pinned ones too, say after a reinstall): the finalizer
    # still waits for the hosts pinned at a live generation.
    applied(sessions, clock, {}, *held)
    with sessions() as session:
        row = session.get(Profile, NAME)
        assert row is not None and row.deletion_timestamp is not None
        assert rollouts.held_live(session, NAME) == sorted(h for h in held if h != first)

    # A host declared gone holds nothing, whatever its pin.
    gone = next(h for h in held if h != first)
    with sessions() as session:
        hosts.delete(session, gone, clock())
    with sessions() as session:
        assert gone not in rollouts.held_live(session, NAME)
        assert session.get(Profile, NAME) is not None

    # The rollout completes (the driver releases its pins): the profile goes, and its rollout with it.
    with sessions() as session:
        rollouts.release(session, NAME)
        assert finalizers.release_finished(session, clock()) == [NAME]
        session.commit()
    with sessions() as session:
        assert session.get(Profile, NAME) is None and session.get(Rollout, NAME) is None
        assert rollouts.pins_of(session, NAME) == {}
    assert stored_generations(sessions) == {}


def test_deleting_an_all_at_once_profile_starts_no_rollout(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    with sessions() as session:
        assert profiles.delete(session, NAME, clock())[1] is True  # the hosts hold it
    assert rollout(sessions) is None and pins(sessions) == {}
    assert {h: view(sessions, h) for h in held} == dict.fromkeys(held, ({}, []))


def test_a_profile_created_again_starts_afresh(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: list[str],
) -> None:
    create(sessions, clock, doc(rollout=AT_ONCE))
    with sessions() as session:  # no host applied it: gone at once, rollout records too
        assert profiles.delete(session, NAME, clock())[1] is False
    assert stored_generations(sessions) == {} and pins(sessions) == {}
    create(sessions, clock, doc(512))
    assert stored_generations(sessions) == {1: True}
    first = canary(fleet)
    assert view(sessions, first) == ({NAME: 1}, [512])


# -- status and commands ---------------------------------------------------------------------------
def test_status_and_commands(sessions: sessionmaker[Session], clock: FakeClock, held: list[str]) -> None:
    with sessions() as session:
        assert rollouts.status(session, NAME) is None
        with pytest.raises(NotFound):
            rollouts.command(session, NAME, "pause", "alice", clock())
    replace(sessions, clock, doc(8192))
    with sessions() as session:
        status = rollouts.status(session, NAME, limit=2)
    assert status is not None
    assert (status["generation"], status["previous"], status["phase"]) == (2, 1, "Progressing")
    assert status["wave"] == 1
    assert [w["hosts"] for w in status["waves"]] == [1, 0, 3]
    assert status["counts"]["changing"] == 1 and status["counts"]["pending"] == 3
    assert len(status["hosts"]) == 2 and status["hostsTotal"] == 4  # bounded by the limit
    assert status["maxFailures"] == 0 and status["maxUnavailable"] == 1
    version = status["version"]

    with sessions() as session:
        with pytest.raises(Invalid):
            rollouts.command(session, NAME, "explode", "alice", clock())
        after = rollouts.command(session, NAME, "pause", "alice", clock())
    assert after["pendingCommands"][0]["command"] == "pause" and after["version"] > version
    assert reasons(sessions)[-1] == "PauseRequested"
    for _ in range(rollouts.MAX_PENDING_COMMANDS - 1):  # up to the bound
        with sessions() as session:
            rollouts.command(session, NAME, "resume", "bob", clock())
    with sessions() as session, pytest.raises(Conflict):  # one past it
        rollouts.command(session, NAME, "resume", "bob", clock())


# -- the migration ---------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    yield from new_pg_database("stortune_rollouts")


def test_the_migration_upgrades_a_database_at_0016_with_profiles_and_hosts(
        fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(fresh_url)
    clock = FakeClock()
    try:
        cfg = alembic_config(fresh_url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0016")
        sessions = make_sessions(engine)
        with monkeypatch.context() as m:  # registered as the 0016 server did: no rollout tables
            m.setattr(rollouts, "host_selected", lambda *args: None)
            register(sessions, clock, "h1", "h2")
        with sessions() as session:  # a profile as the 0016 server stored it (no rollout tables)
            now = datetime(2026, 11, 1, tzinfo=UTC)
            spec = profiles.validate(doc()).spec.model_dump(mode="json", by_alias=True, exclude_none=True)
            session.add(Profile(name=NAME, uid="0" * 36, generation=4, resource_version=1, spec=spec,
                                labels={}, annotations={}, status={}, finalizers=[finalizers.FINALIZER],
                                created_at=now, updated_at=now, deletion_timestamp=None))
            session.commit()
        applied(sessions, clock, {NAME: 4}, "h1", "h2")
        upgrade(engine)
        with engine.connect() as conn:
            for table in (ProfileGeneration, Rollout, RolloutPin):
                assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0
        # Generation 4 was never stored in profile_generations: the first rollout keeps it.
        assert replace(sessions, clock, doc(8192)) == 5
        first = canary(["h1", "h2"])
        assert pins(sessions) == {h: 5 if h == first else 4 for h in ("h1", "h2")}
        for host in ("h1", "h2"):
            assert view(sessions, host) == (({NAME: 5}, [8192]) if host == first else ({NAME: 4}, [4096]))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0016")
            assert "rollout_pins" not in sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()


def test_spec_rollout_round_trips_through_storage(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    rollout_doc = {"waves": [{"hosts": 2}, {"percent": 100}], "soak": "2m", "maxFailures": "5%"}
    row = create(sessions, clock, doc(rollout=rollout_doc))
    with sessions() as session:
        stored = profiles.stored_profile(session.get(Profile, row.name) or row)
    assert stored.spec.rollout is not None
    assert (stored.spec.rollout.soak, stored.spec.rollout.maxFailures) == (120.0, "5%")


def test_hostile_a_generation_stored_again_under_its_name_is_parsed_from_its_own_spec() -> None:
    """Hostile: parsed generations were cached by (name, generation, stored at). A profile deleted
    and created again in the same instant (a frozen or coarse clock) under its old name read the
    other's rules. The spec itself is the key now."""
    first = profiles.validate(profile_doc("again", settings={"read_ahead_kb": 4096}))
    second = profiles.validate(profile_doc("again", settings={"read_ahead_kb": 0}))
    spec_of = [p.spec.model_dump(mode="json", by_alias=True, exclude_none=True) for p in (first, second)]
    parsed = [rollouts._parsed("again", 1, spec, None) for spec in spec_of]
    assert [p.spec.rules[0].settings.read_ahead_kb for p in parsed] == [4096, 0]
    assert rollouts._parsed("again", 1, spec_of[0], None) is parsed[0]  # the same content: kept


def _halt_on(sessions: sessionmaker[Session], clock: FakeClock, host: str) -> None:
    """What the driver stores when ``host`` fails: the machine's step and its actions, one write."""
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None
        seen = machine.Observed(hosts={host: machine.HostObservation(failure="apply-failed")})
        state, actions = machine.step(machine.RolloutState.model_validate(row.state), seen,
                                      clock().timestamp())
        row.state, row.phase, row.version = state.model_dump(mode="json"), state.phase, row.version + 1
        rollouts.execute(session, state, actions, clock())
        session.commit()


def test_hostile_a_halted_deletion_is_started_over_by_deleting_again(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    """Hostile: a deletion whose canary failed rolls back and halts; the profile then stays
    Deleting, and could be neither replaced nor created again. A second DELETE (once the cause is
    mended) starts the deletion over at a new tombstone; a DELETE of a deletion in progress does not."""
    first = canary(held)
    assert replace(sessions, clock, doc()) == 2
    applied(sessions, clock, {NAME: 2}, *held)
    with sessions() as session:
        profiles.delete(session, NAME, clock())
    with sessions() as session:  # in progress: a second DELETE changes nothing
        assert profiles.delete(session, NAME, clock())[1] is True
    state = rollout(sessions)
    assert state is not None and (state.generation, state.phase) == (3, "Progressing")
    _halt_on(sessions, clock, first)
    state = rollout(sessions)
    assert state is not None and (state.phase, state.rollback) == ("Halted", True)
    assert pins(sessions) == dict.fromkeys(held, 2)  # the canary holds generation 2 again

    with sessions() as session:
        assert profiles.delete(session, NAME, clock())[1] is True
    state = rollout(sessions)
    assert state is not None and (state.generation, state.previous, state.phase) == (4, 2, "Progressing")
    assert pins(sessions) == {h: 4 if h == first else 2 for h in held}
    assert stored_generations(sessions)[4] is False  # a tombstone
    assert reasons(sessions).count("Deleting") == 2


@pytest.mark.parametrize("taken", [False, True])
def test_hostile_a_pause_outlives_the_generation_it_was_asked_on(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str], taken: bool,
) -> None:
    """Hostile: an SRE pauses because the canary looks wrong; a GitOps sync pushes the next commit
    a minute later. The new rollout started Progressing and changed a new canary. It starts Paused
    (whether the driver had taken the pause yet or not), holding every host where it is."""
    replace(sessions, clock, doc(8192))
    with sessions() as session:
        rollouts.command(session, NAME, "pause", "sre", clock())
    if taken:  # the driver's step took it: the stored phase is Paused
        with sessions() as session:
            row = session.get(Rollout, NAME)
            assert row is not None
            state, _ = machine.step(machine.RolloutState.model_validate(row.state),
                                    machine.Observed(commands=("pause",)), clock().timestamp())
            row.state, row.phase, row.commands = state.model_dump(mode="json"), state.phase, []
            session.commit()
    before = pins(sessions)
    assert replace(sessions, clock, doc(2048)) == 3
    state = rollout(sessions)
    assert state is not None and (state.generation, state.phase) == (3, "Paused")
    assert all(g in (1, 2) for g in pins(sessions).values()) and pins(sessions).keys() == before.keys()
    assert "Paused" in reasons(sessions)
