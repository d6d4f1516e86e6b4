"""Attacks on the progressive rollouts (issue 27): identity over time, size, steering, and the
routes' inputs. Each test is a case someone hostile, hurried or automated would produce.

Services run on the test's database without an app (no driver steps behind the test's back);
the REST cases run the app with its driver stopped, and step it by hand (``pass_once``) when a
case is about what the driver does with a command.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.rollout import machine
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.server.db.tables import Host, Profile, Rollout, RolloutPin
from stortune.server.errors import AlreadyExists
from stortune.server.rollout_driver import host_observation, observe
from stortune.server.services import finalizers, hosts, profiles, rollouts
from stortune.server.services.fleet_state import HostRecord
from tests.server import test_rollout_storage as storage
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.support import FakeClock, TestClient, admin_client
from tests.server.test_rollout_storage import (
    NAME,
    applied,
    canary,
    create,
    doc,
    pins,
    register,
    replace,
    rollout,
    stored_generations,
    view,
)

# The storage tests' fixtures, found by name (sessions is conftest's): four hosts, and those
# hosts holding generation 1 (read_ahead_kb 4096) applied all at once.
fleet = storage.fleet
held = storage.held


def delete_host(sessions: sessionmaker[Session], clock: FakeClock, name: str) -> None:
    with sessions() as session:
        hosts.delete(session, name, clock())


def known(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None
        return list(row.known)


# -- identity over time ---------------------------------------------------------------------------
def test_hostile_a_canary_deleted_and_registered_again_does_not_keep_the_new_generation(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # The canary took generation 2; the machine is then declared gone, and a reinstalled one
    # registers under the same name. It is a host enrolling mid-rollout: the last completed
    # generation (1), not the pin its namesake left behind.
    first = canary(held)
    replace(sessions, clock, doc(8192))
    assert pins(sessions)[first] == 2
    delete_host(sessions, clock, first)
    assert pins(sessions)[first] == 1  # held at the last completed, until the driver enrols a newcomer
    state = rollout(sessions)
    assert state is not None and first not in state.hosts  # departed: not counted for the wave
    assert first not in known(sessions)  # so the driver enrols the newcomer
    register(sessions, clock, first)
    assert view(sessions, first) == ({NAME: 1}, [4096])
    others = [h for h in held if h != first]
    assert {h: pins(sessions)[h] for h in others} == dict.fromkeys(others, 1)  # untouched


def test_hostile_a_host_deleted_after_a_rollback_does_not_come_back_at_the_bad_generation(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # A halted rollout that rolled back never completes, so its pins stay: a host that departed
    # before it was reverted must not find the bad generation on its return.
    first = canary(held)
    replace(sessions, clock, doc(0))
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None
        state = machine.RolloutState.model_validate(row.state)
        row.state = state.model_copy(update={"phase": "Halted", "reason": "FailureLimit",
                                             "rollback": True, "rolledBack": True}).model_dump(mode="json")
        row.phase = "Halted"
        session.commit()
    delete_host(sessions, clock, first)
    register(sessions, clock, first)
    assert view(sessions, first) == ({NAME: 1}, [4096])


@pytest.mark.parametrize("halted", [False, True])
def test_hostile_a_host_new_to_a_live_rollout_holds_the_last_completed_generation_at_once(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str], halted: bool,
) -> None:
    """Hostile: a host registering (or relabelled into the selector) during a rollout had no pin,
    so it took the generation the canary was still being judged on until the driver's next pass;
    after a rollback (a row the driver no longer steps) it kept the bad generation for good. It is
    pinned at the last completed generation in its registration's own transaction."""
    replace(sessions, clock, doc(0))
    if halted:
        with sessions() as session:
            row = session.get(Rollout, NAME)
            assert row is not None
            state = machine.RolloutState.model_validate(row.state)
            halted = {"phase": "Halted", "reason": "FailureLimit", "rollback": True, "rolledBack": True}
            row.state = state.model_copy(update=halted).model_dump(mode="json")
            row.phase = "Halted"
            session.commit()
    register(sessions, clock, "late")
    assert pins(sessions)["late"] == 1 and view(sessions, "late") == ({NAME: 1}, [4096])
    register(sessions, clock, "elsewhere", labels={"role": "database"})  # not selected: no pin
    assert "elsewhere" not in pins(sessions)
    with sessions() as session:  # relabelled into the selector: held the same way
        hosts.set_labels(session, "elsewhere", {"role": "streamer"}, merge=True, now=clock())
    assert pins(sessions)["elsewhere"] == 1 and view(sessions, "elsewhere") == ({NAME: 1}, [4096])
    register(sessions, clock, held[0])  # a host the rollout knows keeps what it holds
    assert pins(sessions)[held[0]] in (1, 2)


def test_hostile_a_host_deleted_while_no_rollout_is_live_changes_no_rollout(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    delete_host(sessions, clock, held[0])
    assert rollout(sessions) is None and pins(sessions) == {}
    register(sessions, clock, held[0])
    assert view(sessions, held[0]) == ({NAME: 1}, [4096])


def test_hostile_labels_changed_mid_rollout_so_no_generation_selects_the_host(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    replace(sessions, clock, doc(8192))
    host = next(h for h in held if pins(sessions)[h] == 1)
    with sessions() as session:
        hosts.set_labels(session, host, {"role": "database"}, merge=False, now=clock())
    # Pinned at 1, which does not select it any more: it holds nothing of the profile, and
    # certainly not generation 2 ahead of its wave.
    assert view(sessions, host) == ({}, [])


def test_hostile_a_profile_deleted_and_created_again_leaves_no_stale_pin(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    first = canary(held)
    replace(sessions, clock, doc(8192))
    with sessions() as session:  # the hosts hold it: the deletion waits, and rolls out in waves
        assert profiles.delete(session, NAME, clock())[1] is True
    # Created again while the old one is still being deleted: refused, naming it.
    with sessions() as session, pytest.raises(AlreadyExists, match="being deleted"):
        profiles.create(session, profiles.validate(doc(512)), clock())
    # Every host gave it up and the deletion's rollout completed (what the driver does then).
    applied(sessions, clock, {}, *held)
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None
        row.state = machine.RolloutState.model_validate(row.state).model_copy(
            update={"phase": "Complete"}).model_dump(mode="json")
        row.phase = "Complete"
        rollouts.release(session, NAME)
        finalizers.release_finished(session, clock())
        session.commit()
    with sessions() as session:
        assert session.get(Profile, NAME) is None
    create(sessions, clock, doc(512))
    assert stored_generations(sessions) == {1: True}
    assert set(pins(sessions).values()) <= {0, 1}
    assert view(sessions, first) == ({NAME: 1}, [512])


# -- size and time --------------------------------------------------------------------------------
def test_hostile_500_replaces_in_a_row_keep_what_is_stored_bounded(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    # A GitOps loop re-applying a flapping value: each write supersedes the last rollout.
    for i in range(500):
        replace(sessions, clock, doc(8192 if i % 2 == 0 else 2048))
    state = rollout(sessions)
    assert state is not None and state.generation == 501 and state.previous == 1
    # Generation 1 (last completed), the newest, and what hosts are pinned at: nothing more.
    assert set(stored_generations(sessions)) <= {1, 501, *pins(sessions).values()}
    assert len(stored_generations(sessions)) <= 3
    assert sorted(pins(sessions)) == held
    with sessions() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Rollout)) == 1
        assert session.scalar(sa.select(sa.func.count()).select_from(RolloutPin)) == len(held)


def _bulk_hosts(sessions: sessionmaker[Session], clock: FakeClock, count: int) -> list[str]:
    """``count`` hosts like one registered host (same topology), written in one statement:
    registering them one by one would measure the registration, not the rollout."""
    register(sessions, clock, "seed")
    names = [f"bulk-{i:05d}" for i in range(count)]
    with sessions() as session:
        seed = session.get(Host, "seed")
        assert seed is not None
        base = {attr.key: getattr(seed, attr.key) for attr in sa.inspect(Host).column_attrs}
        session.execute(sa.insert(Host), [{**base, "name": name, "uid": str(uuid.uuid4()),
                                           "host_key_sha256": hashlib.sha256(name.encode()).hexdigest()}
                                          for name in names])
        session.commit()
    return names


def test_hostile_a_rollout_over_10000_hosts_stays_bounded_to_read(
    sessions: sessionmaker[Session], clock: FakeClock,
) -> None:
    names = _bulk_hosts(sessions, clock, 10_000)
    started = time.perf_counter()
    create(sessions, clock, doc())
    took = time.perf_counter() - started
    print(f"create over {len(names) + 1} hosts: {took:.2f}s")  # a figure for the report, not a bound
    with sessions() as session:
        status = rollouts.status(session, NAME)
        assert status is not None
        assert status["hostsTotal"] == len(names) + 1
        assert status["hostsListed"] == rollouts.DEFAULT_STATUS_HOSTS == len(status["hosts"])
        assert sum(w["hosts"] for w in status["waves"]) == len(names) + 1
        assert [w["hosts"] for w in status["waves"]][:2] == [1, 1000]  # 1, then 10% of 10,001 less 1
        bounded = rollouts.status(session, NAME, limit=10**9)
        assert bounded is not None and bounded["hostsListed"] == rollouts.MAX_STATUS_HOSTS
        assert session.scalar(sa.select(sa.func.count()).select_from(RolloutPin)) == len(names) + 1


# -- steering -------------------------------------------------------------------------------------
@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """An admin's client; the driver is stopped, and stepped by hand where a test says so."""
    with admin_client(app) as test_client:
        assert test_client.portal is not None
        test_client.portal.call(app.state.rollouts.stop)
        yield test_client


HOSTS = ("h1", "h2", "h3", "h4")


def start(client: TestClient, name: str = "vod") -> None:
    for host in HOSTS:
        body = registration(host, topology=loop_topology(host))
        response = client.post(f"{API}/agents/register", json=body)
        assert response.status_code == 200, response.text
    assert client.post(f"{API}/profiles", json=profile_doc(name)).status_code == 201


def set_state(app: FastAPI, name: str = "vod", **changes: Any) -> None:
    with app.state.sessions() as session:
        row = session.get(Rollout, name)
        assert row is not None
        state = machine.RolloutState.model_validate(row.state).model_copy(update=changes)
        row.state = state.model_dump(mode="json")
        row.phase = state.phase
        session.commit()


def status_of(client: TestClient, name: str = "vod") -> dict[str, Any]:
    response = client.get(f"{API}/profiles/{name}/rollout")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def steer(client: TestClient, command: str, name: str = "vod") -> Any:
    return client.post(f"{API}/profiles/{name}/rollout/{command}")


@pytest.mark.parametrize("command", ["resume", "undo"])
def test_hostile_resume_or_undo_after_a_rollback_is_refused_409_saying_why(
    app: FastAPI, client: TestClient, command: str,
) -> None:
    start(client)
    set_state(app, phase="Halted", reason="FailureLimit", rollback=True, rolledBack=True)
    response = steer(client, command)
    assert response.status_code == 409, response.text
    assert "rolled back" in response.json()["message"]
    assert "new generation" in response.json()["message"]
    assert status_of(client)["pendingCommands"] == []


def test_hostile_resume_while_still_reverting_is_refused_too(app: FastAPI, client: TestClient) -> None:
    start(client)
    set_state(app, phase="Halted", reason="Undone", rollback=True, rolledBack=False)
    assert steer(client, "resume").status_code == 409
    assert steer(client, "pause").status_code == 409
    assert status_of(client)["pendingCommands"] == []


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_hostile_pause_or_resume_of_a_complete_rollout_is_refused(
    app: FastAPI, client: TestClient, command: str,
) -> None:
    # Nothing steps a Complete rollout but an undo: a pause would wait in the row for ever.
    start(client)
    set_state(app, phase="Complete")
    response = steer(client, command)
    assert response.status_code == 409, response.text
    assert "Complete" in response.json()["message"]
    assert status_of(client)["pendingCommands"] == []


def test_hostile_a_halt_without_rollback_can_still_be_resumed_and_undone(
    app: FastAPI, client: TestClient,
) -> None:
    start(client)
    set_state(app, phase="Halted", reason="FailureLimit", rollback=False)
    assert steer(client, "resume").status_code == 200
    assert steer(client, "undo").status_code == 200
    assert [c["command"] for c in status_of(client)["pendingCommands"]] == ["resume", "undo"]


def test_hostile_pause_twice_pauses_once_and_says_the_second_did_nothing(
    app: FastAPI, client: TestClient,
) -> None:
    start(client)
    assert steer(client, "pause").status_code == 200
    assert steer(client, "pause").status_code == 200
    app.state.rollouts.pass_once()
    status = status_of(client)
    assert status["phase"] == "Paused" and status["pendingCommands"] == []
    reasons = [e["reason"] for e in client.get(f"{API}/events", params={"profile": "vod"}).json()["items"]]
    assert reasons.count("Paused") == 1 and "Ignored" in reasons


def test_hostile_undo_after_complete_is_taken_by_the_driver(app: FastAPI, client: TestClient) -> None:
    start(client)
    with app.state.sessions() as session:
        row = session.get(Rollout, "vod")
        assert row is not None
        state = machine.RolloutState.model_validate(row.state)
        hosts_done = {h: s.model_copy(update={"stage": "updated", "generation": 1})
                      for h, s in state.hosts.items()}
        done = state.model_copy(update={"phase": "Complete", "hosts": hosts_done})
        row.state = done.model_dump(mode="json")
        row.phase = "Complete"
        rollouts.release(session, "vod")
        session.commit()
    assert steer(client, "undo").status_code == 200
    app.state.rollouts.pass_once()
    status = status_of(client)
    assert (status["phase"], status["reason"], status["rollback"]) == ("Halted", "Undone", True)
    assert status["pendingCommands"] == []


# -- the routes' inputs ---------------------------------------------------------------------------
@pytest.mark.parametrize("params", [
    {"limit": -1}, {"limit": ""}, {"limit": "1e3"}, {"limit": "10001"}, {"limit": 2**70},
    {"timeoutSeconds": "1.5", "watch": "true"}, {"timeoutSeconds": -5, "watch": "true"},
    {"watch": "2"}, {"watch": ""}, {"limit": "NaN"},
])
def test_hostile_fuzzed_query_parameters_are_422_naming_the_parameter(
    client: TestClient, params: dict[str, Any],
) -> None:
    start(client)
    response = client.get(f"{API}/profiles/vod/rollout", params=params)
    assert response.status_code == 422, (params, response.text)
    fields = {c["field"] for c in response.json()["details"]["causes"]}
    assert fields <= {f"query.{k}" for k in params} and fields, (params, fields)


@pytest.mark.parametrize("name", ["..", "%2e%2e", "vod%2Frollout", "vod%00", "v%C3%B6d", "a" * 64,
                                  "'%20OR%201=1--", "%0d%0aX-Injected:%201"])
def test_hostile_names_in_the_url_are_404_never_500(client: TestClient, name: str) -> None:
    start(client)
    for method, path in (("GET", "rollout"), ("POST", "rollout/pause"), ("POST", "rollout/undo")):
        response = client.request(method, f"{API}/profiles/{name}/{path}")
        assert 400 <= response.status_code < 500, (name, method, path, response.status_code, response.text)
        assert "X-Injected" not in response.headers
    assert status_of(client)["pendingCommands"] == []


# -- one failure, one setting (the driver's observation, pure) -------------------------------------
def _record(applied: dict[str, int], **conditions: tuple[str, str]) -> HostRecord:
    return HostRecord(name="h1", version=1, address="h1.example:7443", agent_version="0.1.0", kernel="6.1.0",
                      conditions={"Ready": ("True", ""), "Reachable": ("True", ""), **conditions},
                      labels={"role": "streamer"}, settings=(), applied=applied)


def _one_host_state(stage: machine.Stage, generation: int) -> machine.RolloutState:
    started, _ = machine.start(NAME, RolloutSpec(), 2, 1, ["h1"], now=0.0)
    host = started.hosts["h1"].model_copy(update={"stage": stage, "generation": generation})
    return started.model_copy(update={"hosts": {"h1": host}})


def test_hostile_another_profiles_failed_apply_is_not_this_rollouts_failure() -> None:
    # h1 holds generation 2 of this profile; its apply of another profile then fails (Applied
    # is host-wide): not a failure of this rollout.
    state = _one_host_state("updated", 2)
    seen = host_observation(state, "h1", _record({NAME: 2, "other": 5}, Applied=("False", "ApplyFailed")),
                            lambda _h, _g: False)
    assert seen.failure is None and seen.generation == 2
    # Still on its way to 2 when the apply fails: that one is this rollout's.
    state = _one_host_state("changing", 2)
    seen = host_observation(state, "h1", _record({NAME: 1}, Applied=("False", "ApplyFailed")),
                            lambda _h, _g: False)
    assert seen.failure == "apply-failed"


def test_hostile_an_unreachable_host_fails_once_however_many_steps_see_it() -> None:
    state = _one_host_state("changing", 2)
    record = _record({NAME: 1}, Reachable=("False", "LeaseExpired"), Ready=("False", "Unreachable"))
    failures = []
    for _ in range(5):  # the driver steps while the host stays away
        seen = observe(state, {"h1": record}, holds_nothing=lambda _h, _g: False, selects=None, known={"h1"})
        state, _actions = machine.step(state, seen, 10.0)
        failures.append(state.failures)
    assert failures == [1] * 5
    # Past maxFailures (0): halted, and the failed host is put back (desired at 1 while away).
    assert (state.phase, state.reason, state.hosts["h1"].failure) == ("Halted", "FailureLimit", "unreachable")


def test_hostile_a_canary_registered_again_enrols_in_the_last_wave_through_the_driver(
    app: FastAPI, client: TestClient,
) -> None:
    start(client)
    first = next(h["name"] for h in status_of(client)["hosts"] if h["wave"] == 1)
    assert client.delete(f"{API}/hosts/{first}").status_code == 200
    body = registration(first, topology=loop_topology(first))
    assert client.post(f"{API}/agents/register", json=body).status_code == 200
    app.state.rollouts.pass_once()
    hosts_now = {h["name"]: h for h in status_of(client)["hosts"]}
    # A newcomer: the last completed generation (0, nothing of the profile) in the last wave.
    assert (hosts_now[first]["wave"], hosts_now[first]["generation"]) == (3, 0)
    with app.state.sessions() as session:
        assert rollouts.pins_of(session, "vod")[first] == 0


def test_hostile_a_rollout_started_anew_at_the_version_a_watcher_holds_is_seen_as_moved(
    sessions: sessionmaker[Session], clock: FakeClock, held: list[str],
) -> None:
    """Hostile: a row started anew (after an all-at-once change) counts its version from 1
    again; a watcher holding the old row's version saw no change, and its stream never ended."""
    replace(sessions, clock, doc(8192))
    with sessions() as session:
        seen = rollouts.status(session, NAME)
    assert seen is not None
    replace(sessions, clock, doc(8192, rollout={"strategy": "all-at-once"}))
    with sessions() as session:
        assert rollouts.version(session, NAME) is None
    replace(sessions, clock, doc(2048))
    with sessions() as session:
        row = session.get(Rollout, NAME)
        assert row is not None
        session.execute(sa.update(Rollout).where(Rollout.profile == NAME).values(version=seen["version"]))
        session.commit()
    with sessions() as session:
        now = rollouts.version(session, NAME)
    assert now is not None and now[0] == seen["version"] and now != rollouts.seen_version(seen)
