"""Concurrent writers: optimistic concurrency holds and nobody sees "database is locked"."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI

from stortune.server.errors import Conflict
from stortune.server.services import hosts, profiles
from stortune.server.services.host_keys import Proof
from tests.server.builders import API, host_key, keyed, profile_doc, registration
from tests.server.support import admin_client

WRITERS = 8


def test_one_of_many_writers_with_the_same_version_wins(app: FastAPI) -> None:
    with admin_client(app) as client:
        first = client.post(f"{API}/profiles", json=profile_doc()).json()
    start = threading.Barrier(WRITERS)

    def write(priority: int) -> str:
        doc: dict[str, Any] = {**first, "spec": {**first["spec"], "priority": priority}}
        with app.state.sessions() as session:
            start.wait()
            try:
                profiles.replace(session, "streaming", profiles.validate(doc), app.state.clock())
            except Conflict:
                return "conflict"
            return "ok"

    with ThreadPoolExecutor(WRITERS) as pool:
        outcomes = list(pool.map(write, range(1, WRITERS + 1)))
    assert sorted(outcomes) == ["conflict"] * (WRITERS - 1) + ["ok"]
    with app.state.sessions() as session:
        assert profiles.get(session, "streaming").generation == 2


def test_heartbeats_and_writes_interleave(app: FastAPI) -> None:
    """Heartbeats (one UPDATE, no counter) racing label writes (counter, then row) never deadlock."""
    from stortune.server.models.agents import Heartbeat

    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration("h1"), headers=keyed("h1"))

    def beat(_: int) -> None:
        with app.state.sessions() as session:
            hosts.heartbeat(session, "h1", Heartbeat(boot_id="boot-1"), proof=Proof(host_key("h1")),
                            lease_duration_s=15, now=app.state.clock())

    def label(i: int) -> None:
        with app.state.sessions() as session:
            hosts.set_labels(session, "h1", {"n": str(i)}, merge=True, now=app.state.clock())

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda i: (beat if i % 2 else label)(i), range(40)))
    with app.state.sessions() as session:
        assert hosts.get(session, "h1").labels["n"] in {str(i) for i in range(0, 40, 2)}


def test_agents_enrolling_at_once_while_others_heartbeat_all_get_certificates(app: FastAPI) -> None:
    """A fleet booting together: every CSR is signed, none sees "database is locked"."""
    from stortune.api.agent import tls
    from stortune.server.models.agents import Heartbeat

    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration("h1"), headers=keyed("h1"))
    csrs = {f"enroll-{i}": tls.make_csr(tls.new_key(), f"enroll-{i}") for i in range(WRITERS)}
    start = threading.Barrier(WRITERS * 2)

    def enroll(name: str) -> str:
        with app.state.sessions() as session:
            start.wait()
            app.state.agent_pki.issue(session, name, csrs[name], app.state.clock())
        return name

    def beat(_: str) -> None:
        start.wait()
        for _ in range(10):
            with app.state.sessions() as session:
                hosts.heartbeat(session, "h1", Heartbeat(), proof=Proof(host_key("h1")), lease_duration_s=15,
                                now=app.state.clock())

    with ThreadPoolExecutor(WRITERS * 2) as pool:
        enrolled = [f.result() for f in [pool.submit(enroll, n) for n in csrs]
                    + [pool.submit(beat, "") for _ in range(WRITERS)]]
    assert sorted(filter(None, enrolled)) == sorted(csrs)


def test_heartbeats_of_a_fleet_never_see_a_locked_database(app: FastAPI) -> None:
    """Each heartbeat may count the fleet (its pace) before renewing: never read-then-write."""
    from stortune.server.services.pacing import FleetSize

    app.state.fleet_size = FleetSize(app.state.sessions, ttl_s=0)  # every heartbeat counts
    with admin_client(app) as client:
        for i in range(WRITERS):
            client.post(f"{API}/agents/register", json=registration(f"b{i}"))
        start = threading.Barrier(WRITERS)

        def beat(i: int) -> list[int]:
            start.wait()
            return [client.post(f"{API}/agents/b{i}/heartbeat", json={"boot_id": "boot-1"}).status_code
                    for _ in range(10)]

        with ThreadPoolExecutor(WRITERS) as pool:
            codes = [code for codes in pool.map(beat, range(WRITERS)) for code in codes]
    assert set(codes) == {200}
