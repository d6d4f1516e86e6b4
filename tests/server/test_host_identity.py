"""A host's identity: the fleet's shared bootstrap token enrolls new names only.

The real control plane (uvicorn on 127.0.0.1, on SQLite and on PostgreSQL) and
the real agent (``stortune.agent.serve.Agent``, its registration loop and host
key) over TCP: whoever holds the bootstrap token cannot re-register, heartbeat
for or upload a topology for a host another agent enrolled; each refusal is a
409 or 403 and an audit record; the host's own agent keeps working, also after
a restart; an admin deleting the host frees the name; an admin may still act
for any host. The in-process tests below them pin down the rules themselves.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select, update

from stortune.agent import hostkey
from stortune.agent.serve import Agent, ServeOptions
from stortune.api.agent import HOST_KEY_HEADER, tls
from stortune.server import serving
from stortune.server.auth import Role
from stortune.server.db.tables import Base, Host
from tests.fixtures.agent_host import Host as FixtureHost
from tests.fixtures.agent_host import build_host
from tests.server.builders import API, host_key, keyed, loop_topology, registration
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client, bearer, issue_token

FIELD = f"header.{HOST_KEY_HEADER}"
BEAT = {"topology_hash": "", "boot_id": "boot-1"}
WRONG = {HOST_KEY_HEADER: "w" * 43}


@dataclass
class Plane:
    """A control plane served by uvicorn on 127.0.0.1, and the tokens it issued."""

    url: str
    app: FastAPI
    clock: FakeClock
    admin: str
    bootstrap: str  # the agents' shared token (role agent)

    def http(self, token: str, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url + API, timeout=10,
                            headers={"Authorization": f"Bearer {token}", **headers})

    def host(self, name: str = "h1") -> dict[str, Any]:
        with self.http(self.admin) as c:
            response = c.get(f"/hosts/{name}")
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

    def audit(self, resource: str) -> list[tuple[str, int]]:
        """(method, code) of the audit records about ``resource``, oldest first."""
        with self.http(self.admin) as c:
            items = c.get("/audit", params={"resource": resource, "limit": 1000}).json()["items"]
        return [(r["method"], r["code"]) for r in reversed(items)]

    def heartbeat_accepted(self) -> None:
        """Wait until a heartbeat sent after now was accepted (the fake clock moves the renew time)."""
        moved = self.clock.advance(1)
        deadline = time.monotonic() + 20
        while True:
            with self.http(self.admin) as c:
                lease = c.get("/hosts/h1/lease").json()
            if lease["renewTime"] == moved.isoformat().replace("+00:00", "Z"):
                return
            assert time.monotonic() < deadline, f"no heartbeat accepted since {moved}: {lease}"
            time.sleep(0.05)


@pytest.fixture
def plane(make_app: AppFactory, clock: FakeClock) -> Iterator[Plane]:
    # A short lease: watching agents are renewed every third of it, which heartbeat_accepted waits for.
    app = make_app(lease_duration_s=1.5, heartbeat_interval_s=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = serving.Server(app, log_level="warning", lifespan="on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the control plane did not start"
            time.sleep(0.02)
        yield Plane(f"http://127.0.0.1:{sock.getsockname()[1]}", app, clock,
                    issue_token(app, Role.ADMIN, name="admin"), issue_token(app, Role.AGENT, name="fleet"))
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


StartAgent = Callable[..., Agent]


@pytest.fixture
def start_agent(plane: Plane, tmp_path: Path) -> Iterator[StartAgent]:
    """``start_agent(host, state_dir)``: the real agent named h1 registering with ``plane``."""
    started: list[Agent] = []

    def start(host: FixtureHost, state: Path, **options: Any) -> Agent:
        agent = Agent(host.fs, state, ServeOptions(**{
            "listen": "127.0.0.1:0", "server": plane.url, "token": plane.bootstrap, "name": "h1",
            "labels": {"role": "streamer"}, "heartbeat": 0.1, "rescan_interval": 0.2, "grace": 1,
            "backoff_base": 0.05, "backoff_cap": 0.2, "insecure": True, **options}))
        started.append(agent)
        agent.start()
        return agent

    yield start
    for agent in started:
        agent.stop()


def registered(agent: Agent, plane: Plane, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while agent.registrar is None or agent.registrar.state != "registered":
        state = agent.registrar.state if agent.registrar else None
        assert time.monotonic() < deadline, f"agent not registered; state {state}"
        time.sleep(0.05)


def refused(agent: Agent, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while agent.registrar is None or agent.registrar.state != "refused":
        state = agent.registrar.state if agent.registrar else None
        assert time.monotonic() < deadline, f"agent not refused; state {state}"
        time.sleep(0.05)


def topology_devices(plane: Plane) -> list[str]:
    with plane.http(plane.admin) as c:
        return [d["name"] for d in c.get("/hosts/h1/topology").json()["devices"]]


# -- the real agent and the real control plane ------------------------------------------------------
def test_the_bootstrap_token_cannot_take_over_an_enrolled_host(
        plane: Plane, start_agent: StartAgent, host: FixtureHost, tmp_path: Path) -> None:
    """The takeover of issue 14: the bootstrap token and an enrolled host's name, with new labels
    and another address, without and with a made-up key. Refused (409) and audited; the host's
    labels and address stay; its real agent's heartbeats and topology uploads keep working."""
    agent = start_agent(host, tmp_path / "state")
    registered(agent, plane)
    before = plane.host()
    assert before["metadata"]["labels"] == {"role": "streamer"}
    takeover = {**registration("h1", labels={"role": "attacker"}), "address": "10.66.66.66:50051"}
    for headers in ({}, WRONG, {HOST_KEY_HEADER: ""}):
        with plane.http(plane.bootstrap, **headers) as attacker:
            response = attacker.post("/agents/register", json=takeover)
        assert response.status_code == 409, response.text
        assert response.json()["details"]["causes"][0]["field"] == FIELD
        assert "an admin deletes the host" in response.json()["message"]

    after = plane.host()
    assert after["metadata"]["labels"] == {"role": "streamer"}
    assert after["spec"]["address"] == before["spec"]["address"] == agent.address
    assert after["status"]["reportedLabels"] == {"role": "streamer"}
    assert plane.audit("hosts/h1").count(("POST", 409)) == 3

    plane.heartbeat_accepted()  # the real agent keeps its lease
    host.builder.loop(8, size=65536, backing_file="/var/tmp/hotplug.img")  # and its topology current
    deadline = time.monotonic() + 20
    while "loop8" not in topology_devices(plane):
        assert time.monotonic() < deadline, "the agent's topology upload did not arrive"
        time.sleep(0.05)
    # The upload's audit record is written as its answer starts, after the topology committed.
    while not (uploads := plane.audit("agents/h1/topology")):
        assert time.monotonic() < deadline, "the topology upload was not audited"
        time.sleep(0.05)
    assert uploads[-1] == ("PUT", 200)
    assert agent.registrar is not None and agent.registrar.state == "registered"


def test_heartbeats_and_topology_uploads_without_the_host_key_are_403_and_audited(
        plane: Plane, start_agent: StartAgent, host: FixtureHost, tmp_path: Path) -> None:
    """Hostile: a heartbeat (it could clear an expired lease or fake a reboot) and a topology upload
    (it decides what is planned) for an enrolled host, without a key and with a wrong one."""
    agent = start_agent(host, tmp_path / "state")
    registered(agent, plane)
    devices = topology_devices(plane)
    forged = loop_topology("h1").model_dump(mode="json")
    for headers in ({}, WRONG):
        with plane.http(plane.bootstrap, **headers) as attacker:
            beat = attacker.post("/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "forged"})
            upload = attacker.put("/agents/h1/topology", json={"topology": forged})
        for response in (beat, upload):
            assert response.status_code == 403, response.text
            assert response.json()["details"]["causes"][0]["field"] == FIELD
            assert response.json()["details"]["name"] == "h1"
    assert plane.audit("agents/h1/heartbeat") == [("POST", 403)] * 2  # accepted ones: not audited
    assert plane.audit("agents/h1/topology").count(("PUT", 403)) == 2
    assert topology_devices(plane) == devices
    assert plane.host()["status"]["bootId"] != "forged"
    plane.heartbeat_accepted()


def test_an_agent_restarted_with_its_state_keeps_its_name(
        plane: Plane, start_agent: StartAgent, host: FixtureHost, tmp_path: Path) -> None:
    """Its key is in the state directory: it registers again, and the name stays its own."""
    state = tmp_path / "state"
    first = start_agent(host, state)
    registered(first, plane)
    key = hostkey.load_or_create(state)
    first.stop()
    again = start_agent(host, state)
    registered(again, plane)
    assert hostkey.load_or_create(state) == key
    plane.heartbeat_accepted()
    assert ("POST", 409) not in plane.audit("hosts/h1")
    with plane.http(plane.bootstrap, **WRONG) as attacker:
        assert attacker.post("/agents/register", json=registration("h1")).status_code == 409


def test_a_replaced_machine_enrolls_the_name_once_an_admin_deletes_the_host(
        plane: Plane, start_agent: StartAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The machine was reinstalled: its agent (a new state directory, so a new key) is refused and
    says what to do, and enrolls once an admin has deleted the host; the old key is refused then."""
    old_state, new_state = tmp_path / "old-state", tmp_path / "new-state"
    old = start_agent(build_host(tmp_path / "old"), old_state)
    registered(old, plane)
    old.stop()
    with caplog.at_level(logging.INFO, logger="stortune.agent.registration"):
        new = start_agent(build_host(tmp_path / "new"), new_state)
        refused(new)
        with plane.http(plane.admin) as admin:
            assert admin.delete("/hosts/h1").status_code == 200
        registered(new, plane)
    (told,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "an admin deletes the host" in told and str(hostkey.path_in(new_state)) in told
    assert plane.host()["spec"]["address"] == new.address
    plane.heartbeat_accepted()

    with plane.http(plane.bootstrap, **{HOST_KEY_HEADER: hostkey.load_or_create(old_state)}) as c:
        assert c.post("/agents/register", json=registration("h1")).status_code == 409


def test_an_admin_may_still_register_an_enrolled_host_by_hand(
        plane: Plane, start_agent: StartAgent, host: FixtureHost, tmp_path: Path) -> None:
    agent = start_agent(host, tmp_path / "state")
    registered(agent, plane)
    with plane.http(plane.admin) as admin:
        by_hand = admin.post("/agents/register", json=registration("h1", labels={"rack": "a3"}))
        assert by_hand.status_code == 200, by_hand.text
    assert plane.host()["status"]["reportedLabels"] == {"rack": "a3"}
    plane.heartbeat_accepted()  # the agent's key is still the pinned one
    assert agent.registrar is not None and agent.registrar.state == "registered"
    with plane.http(plane.bootstrap) as attacker:  # and the admin's call unpinned nothing
        assert attacker.post("/agents/register", json=registration("h1")).status_code == 409


# -- the rules, in process ---------------------------------------------------------------------------
@pytest.fixture
def agent_headers(token_for: Callable[..., str]) -> dict[str, str]:
    return bearer(token_for(Role.AGENT))


def test_an_agent_enrolls_a_name_only_with_a_key_of_its_own(
        client: TestClient, agent_headers: dict[str, str]) -> None:
    """Hostile: no key (it could be taken over by anyone), an empty and a guessable one."""
    for key in (None, "", "short", "k" * 300, "not a key at all, with spaces in it........"):
        headers = agent_headers if key is None else {**agent_headers, HOST_KEY_HEADER: key}
        response = client.post(f"{API}/agents/register", json=registration("h1"), headers=headers)
        assert response.status_code == 422, (key, response.text)
        assert response.json()["details"]["causes"][0]["field"] == FIELD
    assert client.get(f"{API}/hosts/h1").status_code == 404
    ok = client.post(f"{API}/agents/register", json=registration("h1"), headers={**agent_headers, **keyed()})
    assert ok.status_code == 200, ok.text


def test_a_refused_heartbeat_renews_nothing_and_is_audited(
        client: TestClient, agent_headers: dict[str, str], clock: FakeClock) -> None:
    own = {**agent_headers, **keyed()}
    assert client.post(f"{API}/agents/register", json=registration(), headers=own).status_code == 200
    lease = client.get(f"{API}/hosts/h1/lease").json()
    clock.advance(30)  # past the lease: the next heartbeat would clear the expiry
    refused = client.post(f"{API}/agents/h1/heartbeat", json=BEAT, headers={**agent_headers, **WRONG})
    assert refused.status_code == 403
    assert client.get(f"{API}/hosts/h1/lease").json() == lease
    assert client.post(f"{API}/agents/h1/heartbeat", json=BEAT, headers=own).status_code == 200
    assert client.post(f"{API}/agents/h2/heartbeat", json=BEAT, headers=own).status_code == 404
    audited = client.get(f"{API}/audit", params={"limit": 10}).json()["items"]
    assert [(r["resource"], r["code"]) for r in audited] == [
        ("agents/h2/heartbeat", 404), ("agents/h1/heartbeat", 403), ("hosts/h1", 200)]


def test_a_host_registered_before_host_keys_is_pinned_by_its_next_registration(
        app: FastAPI, client: TestClient, agent_headers: dict[str, str]) -> None:
    """A legacy host (no pin): its old agent's calls are accepted as before; the next registration
    with a key pins it, and from then on only that key."""
    assert client.post(f"{API}/agents/register", json=registration(), headers=keyed()).status_code == 200
    with app.state.sessions() as session:
        session.execute(update(Host).where(Host.name == "h1").values(host_key_sha256=None))
        session.commit()
    assert client.post(f"{API}/agents/h1/heartbeat", json=BEAT, headers=agent_headers).status_code == 200
    mine = {**agent_headers, **keyed()}
    assert client.post(f"{API}/agents/register", json=registration(), headers=mine).status_code == 200
    other = {**agent_headers, HOST_KEY_HEADER: host_key("someone-else")}
    assert client.post(f"{API}/agents/register", json=registration(), headers=other).status_code == 409
    assert client.post(f"{API}/agents/h1/heartbeat", json=BEAT, headers=agent_headers).status_code == 403
    assert client.post(f"{API}/agents/h1/heartbeat", json=BEAT, headers=mine).status_code == 200


def test_a_certificate_for_an_enrolled_host_needs_its_key(
        client: TestClient, agent_headers: dict[str, str]) -> None:
    """Hostile: a CSR for an enrolled host's name from a bootstrap token holder without its key
    (the name's first certificate would otherwise go to them)."""
    own = {**agent_headers, **keyed()}
    assert client.post(f"{API}/agents/register", json=registration(), headers=own).status_code == 200
    csr = {"name": "h1", "csr": tls.make_csr(tls.new_key(), "h1").decode()}
    for headers in (agent_headers, {**agent_headers, **WRONG}):
        response = client.post(f"{API}/agents/certificate", json=csr, headers=headers)
        assert response.status_code == 409, response.text
        assert response.json()["details"]["causes"][0]["field"] == FIELD
    assert client.post(f"{API}/agents/certificate", json=csr, headers=own).status_code == 200


def test_the_database_keeps_a_digest_of_the_key_only(app: FastAPI, agent_headers: dict[str, str]) -> None:
    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration(), headers={**agent_headers, **keyed()})
    with app.state.engine.connect() as conn:
        dump = "\n".join(repr(tuple(row)) for table in Base.metadata.sorted_tables
                         for row in conn.execute(select(table)))
        pinned = conn.execute(select(Host.host_key_sha256)).scalar_one()
    assert host_key() not in dump
    assert pinned is not None and len(pinned) == 64
